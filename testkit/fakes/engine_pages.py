"""Serving engines' Prometheus /metrics pages (vLLM 0.32, SGLang), filled in from
templates with chosen values: what the node agent scrapes where no engine runs."""

from __future__ import annotations

from pathlib import Path
from string import Template
from typing import Any

PAGES = Path(__file__).parent / "engine_pages"

VLLM_DEFAULTS: dict[str, Any] = {
    "model": "tiny-llama", "running": 3, "waiting": 1, "kv_usage": 0.25, "queries": 4096,
    "hits": 2048, "cached": 2048, "flops": 1.5e12, "read_bytes": 3.2e9, "drafts": 300,
    "accepted": 210,
}
SGLANG_DEFAULTS: dict[str, Any] = {
    "model": "meta-llama/Llama-3.1-8B-Instruct", "running": 5, "waiting": 2,
    "kv_usage": 0.28, "hit_rate": 0.42, "accept_length": 2.5, "prompt": 10000,
    "cached_device": 3000, "cached_host": 1000,
}


def render_vllm(**values: Any) -> str:
    return Template((PAGES / "vllm_0_32.prom").read_text()).substitute({**VLLM_DEFAULTS,
                                                                        **values})


def render_sglang(**values: Any) -> str:
    return Template((PAGES / "sglang.prom").read_text()).substitute({**SGLANG_DEFAULTS,
                                                                     **values})
