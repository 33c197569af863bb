"""A toy tokenizer: one id per whitespace-separated word (stable CRC32), words back out.

Good enough to give the simulated engine realistic token counts and shared prefixes;
not a real BPE. Text only ever flows through it, never into telemetry.
"""

from __future__ import annotations

import zlib

TOY_VOCAB_SIZE = 50_000
_RESERVED_IDS = 16
_OUTPUT_WORDS = (
    "the", "request", "token", "cache", "prefix", "decode", "prefill", "latency", "cost",
    "gpu", "batch", "stream", "model", "serving", "memory", "bandwidth", "network", "path",
    "stage", "of", "and", "a", "is", "to", "in", "for", "with", "on", "this", "that",
)


class ToyTokenizer:
    """Whitespace/CRC32 tokenizer with a fixed vocabulary size."""

    vocab_size = TOY_VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        span = TOY_VOCAB_SIZE - _RESERVED_IDS
        return [
            _RESERVED_IDS + zlib.crc32(word.encode("utf-8")) % span for word in text.split()
        ]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(self.decode_token(token_id) for token_id in token_ids)

    def decode_token(self, token_id: int) -> str:
        return " " + _OUTPUT_WORDS[token_id % len(_OUTPUT_WORDS)]
