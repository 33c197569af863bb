"""Ingest limits shared by the receivers and the assembler (docs/reliability.md: bounded)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenpath.config import check, validate_fields

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_ATTRIBUTES_PER_SPAN = 128
DEFAULT_MAX_ATTRIBUTE_VALUE_LENGTH = 4096
DEFAULT_MAX_EVENTS_PER_SPAN = 128
DEFAULT_MAX_LABEL_VALUES = 50

_COUNT = check(integer=True, gt=0)  # "must be an integer > 0"


@dataclass(frozen=True, slots=True)
class IngestLimits:
    max_body_bytes: int = field(default=DEFAULT_MAX_BODY_BYTES, metadata=_COUNT)
    max_decompressed_bytes: int = field(default=DEFAULT_MAX_DECOMPRESSED_BYTES,
                                        metadata=_COUNT)
    max_attributes_per_span: int = field(default=DEFAULT_MAX_ATTRIBUTES_PER_SPAN,
                                         metadata=_COUNT)
    max_attribute_value_length: int = field(default=DEFAULT_MAX_ATTRIBUTE_VALUE_LENGTH,
                                            metadata=_COUNT)
    max_events_per_span: int = field(default=DEFAULT_MAX_EVENTS_PER_SPAN, metadata=_COUNT)
    # Distinct values per Prometheus label taken from span data (model, pool, status);
    # later values are exported as "other" and counted.
    max_label_values: int = field(default=DEFAULT_MAX_LABEL_VALUES, metadata=_COUNT)
    # GenAI prompt/completion content attributes are dropped unless this is set.
    keep_content_attributes: bool = field(default=False, metadata=check(boolean=True))

    def validate(self) -> None:
        validate_fields(self, "limits")
