"""The package's layers read one way (testkit/support/import_graph.py reads every import,
module level and inside functions): no import cycle anywhere, and the ground floor
(tokenpath's own modules: records, stages, attributes, metric names, config, the query
interface, identity, wire sizes, ...) imports nothing above it."""

from __future__ import annotations

from testkit.support.import_graph import cycles, graph

ABOVE_THE_GROUND_FLOOR = (
    "tokenpath.collector", "tokenpath.agent", "tokenpath.instrumentation",
    "tokenpath.dashboards", "tokenpath.cli",
)
# tokenpath/ modules that sit above the collector: the views (the read side, computed on
# the query interface with the collector's cost models) and the install self-check (runs
# the collector's pipeline on a sample trace)
UPPER_MODULES = frozenset({"tokenpath.views", "tokenpath.install_selfcheck"})


def _ground_floor(name: str) -> bool:
    if name == "tokenpath":  # the package itself (``from tokenpath import attributes``)
        return True
    return (name.startswith("tokenpath.") and not name.startswith(ABOVE_THE_GROUND_FLOOR)
            and name not in UPPER_MODULES)


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_the_ground_floor_imports_nothing_above_it() -> None:
    edges = graph()
    floor = [m for m in edges if _ground_floor(m)]
    assert "tokenpath.records" in floor and "tokenpath.query" in floor
    upward = {m: sorted(t for t in edges[m] if not _ground_floor(t)) for m in floor}
    assert {m: t for m, t in upward.items() if t} == {}


def test_the_graph_sees_function_level_imports() -> None:
    """The reader is not blind to what a cycle hides in: an import inside a function."""
    edges = graph()
    assert "tokenpath.collector.store.factory" in edges["tokenpath.cli.client"]


# The collector's HTTP API is the read side's server: it answers the views over its store.
READ_SIDE_SERVER = frozenset({"tokenpath.collector.http_app"})


def test_the_cli_and_the_views_sit_above_the_collector() -> None:
    """Nothing of the collector's pipeline imports the views or the CLI (its HTTP API
    serves the views), and no command module imports another."""
    edges = graph()
    upper = [m for m in edges
             if m.startswith("tokenpath.collector") and m not in READ_SIDE_SERVER]
    assert upper and {m: t for m in upper if (t := sorted(
        x for x in edges[m] if x == "tokenpath.views" or x.startswith("tokenpath.cli")))} == {}
    commands = {m for m in edges if m.startswith("tokenpath.cli.") and m.endswith("_cmd")}
    assert len(commands) >= 5
    assert {m: t for m in commands if (t := sorted(edges[m] & commands))} == {}
