"""Engine identity: which GPUs served a request (docs/architecture.md, docs/cost-model.md).

Requests share a slice's GPU dollars only with requests on the same GPUs, so every record
names its node and its engine, derived from what deployments already send, in this
precedence (the first that is present wins; docs/cost-model.md has the table):

- node: ``tokenpath.node``, then the resource's ``k8s.node.name``, then ``host.name``;
- engine on it: ``tokenpath.engine.id``, then ``k8s.pod.uid``, ``k8s.pod.name``,
  ``service.instance.id``, then ``tokenpath.engine.replica``.

Each is read from the engine's own spans first (their attributes, then their resource),
so a gateway on another host never names the engine's node.

The pricing unit is the node when one is known (its GPUs, its idle), else the engine
itself. A sharded deployment routes each record to the collector that prices its unit
(:func:`pricing_resource`); distinct engines are never merged into one default node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tokenpath import attributes as A
from tokenpath.metric_names import UNKNOWN

UNKNOWN_UNIT = UNKNOWN
NODE_KEYS = (A.NODE, A.K8S_NODE_NAME, A.HOST_NAME)
ENGINE_KEYS = (A.ENGINE_ID, A.K8S_POD_UID, A.K8S_POD_NAME, A.SERVICE_INSTANCE_ID,
               A.ENGINE_REPLICA)


@dataclass(frozen=True, slots=True)
class EngineIdentity:
    node: str | None
    engine: str | None

    @property
    def pricing_unit(self) -> str:
        """The name the attributor prices under: the node, else the engine."""
        return pricing_unit(self.node, self.engine)


def _first(layers: Iterable[Mapping[str, object]], keys: tuple[str, ...]) -> str | None:
    layers = list(layers)
    for key in keys:  # the precedence is by key first: a later key never beats an earlier
        for layer in layers:
            value = layer.get(key)
            if value is not None and value != "":
                return str(value)
    return None


def identity_from(layers: Iterable[Mapping[str, object]]) -> EngineIdentity:
    """The identity read from attribute layers, nearest the engine first."""
    layers = list(layers)
    return EngineIdentity(_first(layers, NODE_KEYS), _first(layers, ENGINE_KEYS))


def pricing_unit(node: str | None, engine: str | None) -> str:
    """The name a record with this node and engine is priced under (per record: no
    identity object is built)."""
    return node or engine or UNKNOWN_UNIT


def pricing_resource(node: str | None, engine: str | None) -> dict[str, str]:
    """Resource attributes naming a record's pricing unit and nothing else: records that
    must be priced together share them, so a router hashing the resource keeps them on
    one collector."""
    if node:
        return {A.NODE: node}
    if engine:
        return {A.ENGINE_ID: engine}
    return {}


def node_of_resource(resource: Mapping[str, object]) -> str:
    """The node a resource (an agent's pushed metrics) names, by ``NODE_KEYS``."""
    for key in NODE_KEYS:
        value = resource.get(key)
        if value:
            return str(value)
    return UNKNOWN_UNIT
