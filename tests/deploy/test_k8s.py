"""Kubernetes manifests: every object validates with kubernetes-validate (built-in kinds),
the Prometheus Operator objects match what dashboards/ generates, and the agent, collector
and gateway carry the properties the deployment relies on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from tests.deploy.documented_keys import otel_config_errors
from tokenpath.dashboards import generate, rules
from tokenpath.dashboards.definitions import DASHBOARDS

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text("utf-8"))
    documents: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        documents += [d for d in yaml.safe_load_all((K8S / resource).read_text("utf-8")) if d]
    return documents


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in _documents() if d["kind"] == kind]


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text("utf-8"))
    on_disk = {str(p.relative_to(K8S)) for p in K8S.glob("*/*.yaml")}
    assert set(kustomization["resources"]) == on_disk


def test_builtin_objects_validate_with_kubernetes_validate() -> None:
    checked = 0
    for document in _documents():
        if document["kind"] in OPERATOR_KINDS:
            continue
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 10


def test_kubernetes_validate_rejects_a_broken_daemonset() -> None:
    daemonset = _by_kind("DaemonSet")[0]
    broken = json.loads(json.dumps(daemonset))
    broken["spec"]["template"]["spec"]["hostNetwork"] = "yes"
    try:
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError:
        return
    raise AssertionError("a string hostNetwork validated")


def test_agent_daemonset_runs_on_gpu_nodes_hardened() -> None:
    spec = _by_kind("DaemonSet")[0]["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expression = terms["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expression == {"key": "nvidia.com/gpu.present", "operator": "In",
                          "values": ["true"]}
    assert spec["hostNetwork"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_collectors_sit_behind_a_headless_service_the_gateway_resolves() -> None:
    service = next(s for s in _by_kind("Service") if s["metadata"]["name"] ==
                   "tokenpath-collector")
    assert service["spec"]["clusterIP"] == "None"
    deployment = next(d for d in _by_kind("Deployment") if d["metadata"]["name"] ==
                      "tokenpath-collector")
    assert deployment["spec"]["replicas"] >= 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    clickhouse = next(s for s in _by_kind("Service") if s["metadata"]["name"] ==
                      "tokenpath-clickhouse")
    assert args[args.index("--store") + 1] == (
        f"clickhouse://tokenpath@{clickhouse['metadata']['name']}."
        f"{clickhouse['metadata']['namespace']}:8123/tokenpath")
    gateway_map = next(c for c in _by_kind("ConfigMap") if c["metadata"]["name"] ==
                       "tokenpath-otel-gateway")
    config = yaml.safe_load(gateway_map["data"]["config.yaml"])
    assert otel_config_errors(config) == []
    exporter = config["exporters"]["loadbalancing"]
    assert exporter["routing_key"] == "traceID"
    resolver = exporter["resolver"]["k8s"]
    assert resolver["service"] == (f"{service['metadata']['name']}."
                                   f"{service['metadata']['namespace']}")
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "otlp-grpc")
    assert resolver["ports"] == [grpc_port]


def test_prometheus_rule_is_the_generated_rules() -> None:
    rule = _by_kind("PrometheusRule")[0]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == rules.rule_groups(rules.RuleParams())
    rules_file = yaml.safe_load((REPO / generate.RULES_FILE).read_text("utf-8"))
    assert rule["spec"] == rules_file


def test_dashboard_config_maps_carry_the_sidecar_label_and_the_json() -> None:
    maps = [c for c in _by_kind("ConfigMap")
            if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert len(maps) == len(DASHBOARDS)
    for config_map in maps:
        ((name, text),) = config_map["data"].items()
        assert text == (REPO / generate.GRAFANA_DIR / name).read_text("utf-8")


def test_service_monitors_select_existing_services() -> None:
    services = {s["metadata"]["name"]: s for s in _by_kind("Service")}
    for monitor in _by_kind("ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        matches = [s for s in services.values()
                   if selector.items() <= s["metadata"].get("labels", {}).items()]
        assert matches, monitor["metadata"]["name"]
        ports = {p["name"] for s in matches for p in s["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in ports
