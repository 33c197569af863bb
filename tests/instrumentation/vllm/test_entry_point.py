from __future__ import annotations

from importlib.metadata import entry_points
from importlib.util import find_spec

STAT_LOGGER_GROUP = "vllm.stat_logger_plugins"  # vllm/plugins/__init__.py, vLLM 0.32


def test_plugin_is_registered_for_vllm_and_its_module_exists() -> None:
    (plugin,) = [e for e in entry_points(group=STAT_LOGGER_GROUP) if e.name == "tokenpath"]
    module, _, attribute = plugin.value.partition(":")
    assert attribute == "TokenpathStatLogger"
    assert find_spec(module) is not None


def test_package_imports_without_vllm() -> None:
    import tokenpath.instrumentation.vllm as package
    from tokenpath.instrumentation.vllm import exporter, launcher, stats_adapter

    assert package.__doc__
    assert exporter.AnnotationExporter and launcher.start_local_vllm
    assert stats_adapter.engine_step_from_stats
