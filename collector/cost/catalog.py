"""Which roofline a record runs on: the catalog model and the node's GPU type."""

from __future__ import annotations

import re

from tokenpath.records import RequestRecord
from tokenpath.roofline import GPUS, MODELS, Roofline

_SUFFIXES = re.compile(r"-(instruct|chat|hf|base)$")
# Rooflines already built, by (served model name, GPU type, tensor parallel). A Roofline is
# frozen, so records share one: the pricing of every record asked for its roofline anew (a
# name normalization by regular expression and three objects, twice a record). Model
# names come from spans, so the table is bounded: past this many keys it starts over.
MAX_CACHED_ROOFLINES = 1024
_ROOFLINES: dict[tuple[str, str, int], Roofline | None] = {}


def catalog_model_name(model: str) -> str | None:
    """The catalog name for a served model name (``meta-llama/Llama-3.1-8B-Instruct``
    -> ``llama-3.1-8b``), or None when the model is not in the catalog."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    name = name.replace("meta-llama-", "llama-").replace("_", "-")
    previous = None
    while previous != name:
        previous, name = name, _SUFFIXES.sub("", name)
    return name if name in MODELS else None


def roofline_for_record(record: RequestRecord, gpu_type: str) -> Roofline | None:
    """The roofline of the record's model on ``gpu_type``; None when either is unknown."""
    key = (record.model, gpu_type, max(1, record.tensor_parallel))
    if key in _ROOFLINES:
        return _ROOFLINES[key]
    model = catalog_model_name(record.model)
    found = (None if model is None or gpu_type not in GPUS
             else Roofline(GPUS[gpu_type], MODELS[model], tensor_parallel=key[2]))
    if len(_ROOFLINES) >= MAX_CACHED_ROOFLINES:
        _ROOFLINES.clear()
    _ROOFLINES[key] = found
    return found
