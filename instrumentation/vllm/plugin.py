"""tokenpath's vLLM stat-logger plugin (entry-point group ``vllm.stat_logger_plugins``).

vLLM (0.32, V1 engine, async serving) builds one instance per engine in the API-server
process and calls :meth:`TokenpathStatLogger.record` on its output-handling loop after
each engine step. The plugin copies the few numbers it needs into small frozen records
and hands them to :class:`~tokenpath.instrumentation.vllm.exporter.AnnotationExporter`
(bounded queue, export thread); it never blocks and never raises into vLLM.

Per finished request it sends a ``SPAN_REQUEST_ANNOTATION`` span with the request id
(vLLM's external id, the same one its ``llm_request`` span carries as
``gen_ai.request.id``), the prefix-cache hit tokens and preemptions, plus a summary of
the engine steps the request was in flight for. Per flush interval it sends a
``SPAN_ENGINE_STEPS`` summary of the batches the engine ran.

This module imports vLLM; ``tokenpath.instrumentation.vllm`` itself does not.
"""

from __future__ import annotations

import atexit
import logging
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from tokenpath.instrumentation.vllm.config import PluginConfig
from tokenpath.instrumentation.vllm.exporter import (
    AnnotationExporter,
    build_span_exporter,
    served_model_name,
)
from tokenpath.instrumentation.vllm.stats_adapter import (
    engine_step_from_stats,
    finished_requests_from_stats,
)

log = logging.getLogger(__name__)


class TokenpathStatLogger(StatLoggerBase):  # type: ignore[misc]
    """vLLM stat logger that exports per-request cache/preemption facts and step data to
    the tokenpath collector. Configured by environment variables (see ``config.py``)."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.errors = 0
        self._exporter: AnnotationExporter | None = None
        try:
            config = PluginConfig.from_env()
            if config.enabled:
                self._exporter = AnnotationExporter(
                    config, build_span_exporter(config),
                    served_model_name=served_model_name(vllm_config)).start()
                atexit.register(self._exporter.shutdown)
                log.info("tokenpath vLLM plugin exporting to %s", config.endpoint)
        except Exception:
            self.errors += 1
            log.warning("tokenpath vLLM plugin disabled: bad configuration", exc_info=True)

    @property
    def exporter(self) -> AnnotationExporter | None:
        return self._exporter

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        exporter = self._exporter
        if exporter is None:
            return
        try:
            step = engine_step_from_stats(scheduler_stats, iteration_stats)
            if step is not None:
                exporter.submit(step)
            for finished in finished_requests_from_stats(iteration_stats):
                exporter.submit(finished)
        except Exception:
            self.errors += 1

    def log_engine_initialized(self) -> None:
        return None

    def shutdown(self) -> None:
        if self._exporter is not None:
            self._exporter.shutdown()
