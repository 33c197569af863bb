"""Ingest limits shared by the receivers and the assembler (docs/reliability.md: bounded)."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpath.config import ConfigError

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_ATTRIBUTES_PER_SPAN = 128
DEFAULT_MAX_ATTRIBUTE_VALUE_LENGTH = 4096
DEFAULT_MAX_EVENTS_PER_SPAN = 128
DEFAULT_MAX_LABEL_VALUES = 50


@dataclass(frozen=True, slots=True)
class IngestLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    max_attributes_per_span: int = DEFAULT_MAX_ATTRIBUTES_PER_SPAN
    max_attribute_value_length: int = DEFAULT_MAX_ATTRIBUTE_VALUE_LENGTH
    max_events_per_span: int = DEFAULT_MAX_EVENTS_PER_SPAN
    # Distinct values per Prometheus label taken from span data (model, pool, status);
    # later values are exported as "other" and counted.
    max_label_values: int = DEFAULT_MAX_LABEL_VALUES
    # GenAI prompt/completion content attributes are dropped unless this is set.
    keep_content_attributes: bool = False

    def validate(self) -> None:
        for key in (
            "max_body_bytes",
            "max_decompressed_bytes",
            "max_attributes_per_span",
            "max_attribute_value_length",
            "max_events_per_span",
            "max_label_values",
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"limits.{key}", "must be an integer > 0")
        if not isinstance(self.keep_content_attributes, bool):
            raise ConfigError("limits.keep_content_attributes", "must be true or false")
