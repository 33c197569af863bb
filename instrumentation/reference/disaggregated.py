"""Disaggregated serving on the reference path: a prefill pool and a decode pool.

Each request runs its prompt on a prefill engine (one output token, as vLLM's P/D proxy
asks with ``max_tokens: 1``), then its KV cache crosses a simulated link of set bandwidth
to a decode engine, which waits for it in its queue, computes the prompt's last token
itself and generates the response. Both engines emit their ``llm_request`` span under the
same request id and trace; the proxy (this class) records the transferred token count it
relays (``tokenpath.kv_transfer.tokens`` on the gateway's span), and each engine writes its
own ground-truth row (the decode engine's with the KV bytes it received).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field

from tokenpath import attributes as A
from tokenpath.config import ConfigError, check, validate_fields
from tokenpath.instrumentation.gateway import annotate
from tokenpath.instrumentation.reference.engine import SimulatedEngine

# A 400 Gb/s RDMA NIC per node, the order of current P/D deployments' links.
DEFAULT_KV_LINK_BYTES_PER_SECOND = 50e9


@dataclass(frozen=True, slots=True)
class KvLinkConfig:
    """The simulated link the KV cache crosses: ``bytes_per_second`` of bandwidth."""

    bytes_per_second: float = field(default=DEFAULT_KV_LINK_BYTES_PER_SECOND, metadata=check(
        gt=0, key="kv_link_bytes_per_second", message="must be greater than 0"))

    def validate(self) -> None:
        validate_fields(self)


class DisaggregatedEngines:
    """A replica for the router: prefill on the least loaded prefill engine, decode on
    the least loaded decode engine, the KV sent between them over the link."""

    def __init__(self, prefill: Sequence[SimulatedEngine], decode: Sequence[SimulatedEngine],
                 link: KvLinkConfig | None = None) -> None:
        if not prefill or not decode:
            raise ConfigError("replicas", "a prefill and a decode engine at least")
        self.prefill = list(prefill)
        self.decode = list(decode)
        self.link = link or KvLinkConfig()
        self.link.validate()
        self.transferred_tokens = 0
        self.transferred_bytes = 0

    @property
    def load(self) -> int:
        return sum(e.load for e in self.prefill) + sum(e.load for e in self.decode)

    def transfer_seconds(self, engine: SimulatedEngine, tokens: int) -> float:
        """The modeled time of ``tokens`` of KV on the link, times the engine's time scale."""
        nbytes = tokens * engine.roofline.model.kv_bytes_per_token
        return nbytes / self.link.bytes_per_second * engine.config.time_scale

    async def generate(self, prompt_ids: list[int], max_tokens: int,
                       request_id: str | None = None,
                       trace_headers: Mapping[str, str] | None = None
                       ) -> AsyncGenerator[int, None]:
        """Stream the output token ids of one request served by two engines."""
        request_id = request_id or f"cmpl-{uuid.uuid4().hex}"
        prefill = min(self.prefill, key=lambda e: e.load)
        decode = min(self.decode, key=lambda e: e.load)
        async for _ in prefill.generate(prompt_ids, 1, request_id=request_id,
                                        trace_headers=trace_headers):
            pass  # the prefill engine's one token: the decode engine computes its own
        tokens = max(0, len(prompt_ids) - 1)  # the decode engine computes the last one
        annotate(A.KV_TRANSFER_TOKENS, tokens)  # what the proxy relayed
        self.transferred_tokens += tokens
        self.transferred_bytes += round(tokens * decode.roofline.model.kv_bytes_per_token)
        async for token in decode.generate(prompt_ids, max_tokens, request_id=request_id,
                                           trace_headers=trace_headers,
                                           remote_kv_tokens=tokens,
                                           kv_arrives_in=self.transfer_seconds(decode, tokens)):
            yield token
