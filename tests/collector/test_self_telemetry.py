"""Every instrument of every component's telemetry is on /metrics: a counter that exists is
exported. The holders are found by walking a running collector's object graph, and every
Telemetry class the collector defines must be among them."""

from __future__ import annotations

import importlib
import pkgutil
import types
from collections import deque
from typing import Any

import httpx

import tokenpath.collector
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.service import CollectorService
from tokenpath.telemetry import Telemetry

SKIPPED_TYPES = (str, bytes, int, float, bool, type(None), type)


def _telemetry_classes() -> set[type[Telemetry]]:
    for module in pkgutil.walk_packages(tokenpath.collector.__path__, "tokenpath.collector."):
        importlib.import_module(module.name)
    found: set[type[Telemetry]] = set()
    todo = list(Telemetry.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.add(cls)
            todo.extend(cls.__subclasses__())
    return found


def _reachable_holders(root: object) -> list[Telemetry]:
    """Telemetry holders reachable from ``root`` through attributes and containers."""
    seen: set[int] = set()
    holders: list[Telemetry] = []
    queue: deque[Any] = deque([root])
    while queue:
        obj = queue.popleft()
        if id(obj) in seen or isinstance(obj, SKIPPED_TYPES):
            continue
        seen.add(id(obj))
        if isinstance(obj, Telemetry):
            holders.append(obj)
        if isinstance(obj, dict):
            queue.extend(obj.values())
            continue
        if isinstance(obj, list | tuple | set | frozenset | deque):
            queue.extend(obj)
            continue
        module = type(obj).__module__ or ""
        if not module.startswith("tokenpath"):
            continue  # the project's own objects only (not threads, sockets, sqlite)
        names = list(getattr(obj, "__dict__", {}))
        for cls in type(obj).__mro__:
            names.extend(getattr(cls, "__slots__", ()))
            # a compiled class's attributes (tokenpath/compiled.py) are its descriptors
            names.extend(name for name, member in vars(cls).items()
                         if isinstance(member, types.GetSetDescriptorType))
        for name in names:
            try:
                queue.append(getattr(obj, name))
            except AttributeError:
                continue
    return holders


def test_every_instrument_of_every_component_is_on_metrics() -> None:
    service = CollectorService(CollectorConfig(http_port=0, grpc_port=0))
    service.start()
    try:
        body = httpx.get(f"{service.http_url}/metrics", timeout=10).text
        holders = _reachable_holders(service)
    finally:
        service.shutdown()
    classes = _telemetry_classes()
    assert {type(h) for h in holders} == classes, "a Telemetry class no running collector has"
    exported = {line.split()[2] for line in body.splitlines() if line.startswith("# HELP ")}
    missing = sorted(i.spec.series for h in holders for i in h.instruments()
                     if i.spec.series not in exported)
    assert missing == []
    assert sum(1 for h in holders for _ in h.instruments()) >= 30
