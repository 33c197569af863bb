"""RequestRecord's fields, declared once: the record class's code and the store's columns
both come from :data:`FIELDS`.

A field is one line here. ``python -m tokenpath.record_fields`` rewrites the generated part
of tokenpath/records.py from it (the slot declarations, the written ``__init__``,
``to_json`` and ``from_json``), and tests/core/test_record_fields.py fails when that part
differs from what the table gives, so a field added here and not regenerated (or edited
there by hand) is caught. The code is generated as source rather than built at import time
because records.py is compiled by mypyc: a written ``__init__`` compiles to C, and a
dataclass's generated one would run as interpreted Python (tokenpath/records.py says why).

The store (collector/store/layout.py) reads the same table: each field's ``kind`` gives its
column type, and ``storage`` says how it is kept (a typed column, a low-cardinality name
coded through the store's ``names`` table, the 15 stages as wide columns, ...).

This module imports the standard library only.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

# What a field holds; each kind has one JSON conversion and one column type.
STR: Final = "str"  # str, never None
OPT_STR: Final = "opt_str"
INT: Final = "int"
OPT_INT: Final = "opt_int"
FLOAT: Final = "float"
OPT_FLOAT: Final = "opt_float"
BOOL: Final = "bool"
OPT_BOOL: Final = "opt_bool"
STR_TUPLE: Final = "str_tuple"  # tuple[str, ...]
STAGES: Final = "stages"  # dict[StageId, StageTiming]
INT_MAP: Final = "int_map"  # dict[str, int] (keys: tokenpath.leaks.MissCause values)
FLOAT_MAP: Final = "float_map"  # dict[str, float]

# How the store keeps a field (collector/store/layout.py).
COLUMN: Final = "column"  # a typed column of its own
NAME: Final = "name"  # a low-cardinality string: an integer column coded by the names table
STAGE_COLUMNS: Final = "stage_columns"  # seconds, dollars, provenance (and phases) per stage
CAUSE_COLUMNS: Final = "cause_columns"  # one column per miss cause
LIST: Final = "list"  # a variable-length list: one packed column


@dataclass(frozen=True, slots=True)
class RecordField:
    name: str
    kind: str
    # Python source of the default, as records.py spells it; "" for none (required).
    default: str = ""
    comment: str = ""  # written above the field's declaration
    storage: str = COLUMN

    @property
    def annotation(self) -> str:
        return _ANNOTATIONS[self.kind]

    @property
    def optional(self) -> bool:
        return self.kind in (OPT_STR, OPT_INT, OPT_FLOAT, OPT_BOOL)


_ANNOTATIONS: Final[dict[str, str]] = {
    STR: "str", OPT_STR: "str | None", INT: "int", OPT_INT: "int | None", FLOAT: "float",
    OPT_FLOAT: "float | None", BOOL: "bool", OPT_BOOL: "bool | None",
    STR_TUPLE: "tuple[str, ...]", STAGES: "dict[StageId, StageTiming]",
    INT_MAP: "dict[str, int]", FLOAT_MAP: "dict[str, float]",
}

F = RecordField

FIELDS: Final[tuple[RecordField, ...]] = (
    F("trace_id", STR, comment="32 lowercase hex"),
    F("record_id", STR, '""',
      "Unique per record: the trace id for a trace with one LLM call, else\n"
      '"<trace id>-<span id of the call\'s top span>" (a trace with N calls gives N '
      "records)."),
    F("model", STR, "UNKNOWN", storage=NAME),
    F("request_id", OPT_STR, "None"),
    F("status", STR, '"ok"', storage=NAME),
    F("node", OPT_STR, "None", storage=NAME),
    F("pool", OPT_STR, "None", storage=NAME),
    F("tenant", OPT_STR, "None",
      "Who it was for (tokenpath.tenant): the chargeback unit; None: unattributed.",
      storage=NAME),
    F("engine", OPT_STR, "None", 'The engine\'s kind: "vllm", "simulated", ...',
      storage=NAME),
    F("engine_id", OPT_STR, "None",
      "The engine (GPU set) on its node that served it (tokenpath.identity); with "
      "``node``\nit is the pricing unit.", storage=NAME),
    F("gpu_inventory", OPT_BOOL, "None",
      "True when its node's GPUs come from the price sheet's inventory; False when they\n"
      "were assumed (its tensor-parallel GPUs of the default GPU type); None: not priced."),
    F("gpu_type", OPT_STR, "None", storage=NAME),
    F("tensor_parallel", INT, "1"),
    F("simulated", BOOL, "False"),
    F("start_unix", FLOAT, "0.0"),
    F("end_unix", FLOAT, "0.0"),
    F("input_tokens", INT, "0"),
    F("cache_read_tokens", INT, "0"),
    F("output_tokens", INT, "0"),
    F("ttft_seconds", OPT_FLOAT, "None"),
    F("tpot_seconds", OPT_FLOAT, "None"),
    F("queue_seconds", OPT_FLOAT, "None"),
    F("prefill_seconds", OPT_FLOAT, "None"),
    F("decode_seconds", OPT_FLOAT, "None"),
    F("prefill_start_unix", OPT_FLOAT, "None",
      "Engine timeline (unix seconds), from the engine span: scheduled -> first token -> "
      "done."),
    F("decode_start_unix", OPT_FLOAT, "None"),
    F("engine_end_unix", OPT_FLOAT, "None"),
    F("response_bytes", INT, "0"),
    F("response_chunks", INT, "0"),
    F("small_chunks", INT, "0"),
    F("response_packets", INT, "0",
      "TCP segments the response became (the gateway's estimate: ceil(bytes / MSS) per\n"
      "write); 0 when no shim counted them."),
    F("prefix_fingerprints", STR_TUPLE, "()", storage=LIST),
    F("prefix_block_tokens", INT, "0",
      "Tokens per fingerprinted block, as the engine sent it; 0 when it did not say (the\n"
      "collector's cost.prefix_block_tokens applies)."),
    F("stages", STAGES, "None", storage=STAGE_COLUMNS),
    F("cost_dollars", FLOAT, "0.0"),
    F("naive_cost_dollars", FLOAT, "0.0"),
    F("cache_miss_waste_dollars", FLOAT, "0.0"),
    F("complete", BOOL, "True"),
    F("span_count", INT, "0"),
    F("engine_start_unix", OPT_FLOAT, "None",
      "When the engine span began (request arrival at the engine; vLLM's arrival_time)."),
    F("engine_step_seconds", OPT_FLOAT, "None",
      "Sum of the engine steps the request took part in (tokenpath.engine.step_seconds)."),
    F("engine_steps", OPT_INT, "None",
      "How many engine steps it took part in, prefill and decode (tokenpath.engine.steps)."),
    F("response_id", OPT_STR, "None",
      "The response id (gen_ai.response.id) that names the call on every hop."),
    F("outer_hop", OPT_STR, "None",
      '"client" or "proxy" for a record of a client or proxy hop with nothing of the\n'
      "serving side under it (its own trace: collector/call_join.py); None otherwise.",
      storage=NAME),
    F("joined_trace_ids", STR_TUPLE, "()",
      "Traces of the same call joined into this record by response id.", storage=LIST),
    F("client_start_unix", OPT_FLOAT, "None",
      "The GenAI client span of a client hop (unix seconds): what its gaps are taken from."),
    F("client_end_unix", OPT_FLOAT, "None"),
    F("miss_tokens", INT_MAP, "None",
      "Prefill of fingerprinted prefix blocks computed instead of read from the cache, by\n"
      "cause (tokenpath.leaks.MissCause values): tokens and their prefill dollars. The "
      "waste\ncauses sum to cache_miss_waste_dollars.", storage=CAUSE_COLUMNS),
    F("miss_dollars", FLOAT_MAP, "None", storage=CAUSE_COLUMNS),
    F("energy_joules", FLOAT, "0.0",
      "GPU energy of its apportioned GPU time (collector/cost/energy.py), and how it was\n"
      'had: "modeled" (TDP x GPU-seconds) or "measured"; None: not priced.'),
    F("energy_provenance", OPT_STR, "None", storage=NAME),
    F("router_predicted_cache_hit", OPT_FLOAT, "None",
      "The router's predicted prefix-cache hit (0-1 of the prompt), beside the engine's\n"
      "actual one (cache_read_tokens / input_tokens): llm-d's prefix-cache scorer."),
    F("cache_read_source", OPT_STR, "None",
      "Where cache_read_tokens came from (CACHE_SOURCE_*); None: nothing on the path said.",
      storage=NAME),
    F("slo", OPT_STR, "None",
      "Its SLO class (tokenpath/slo.py), set where it is mapped; None: no classes configured.",
      storage=NAME),
    F("slo_outcome", OPT_STR, "None",
      '"met", "missed" or "unknown" against its class\'s targets; None: no class.',
      storage=NAME),
    F("slo_miss_stage", OPT_STR, "None",
      "A missed request's dominant stage (queue, prefill, decode, network) in the measure\n"
      "it missed; None when it did not miss.", storage=NAME),
    F("prefill_engine_id", OPT_STR, "None",
      "A disaggregated request (prefill on one engine, decode on another): the engine and\n"
      "node that ran its prefill and those that ran its decode (``engine_id`` and ``node``\n"
      "name the decode engine); None for a request one engine served.", storage=NAME),
    F("prefill_node", OPT_STR, "None", storage=NAME),
    F("decode_engine_id", OPT_STR, "None", storage=NAME),
    F("decode_node", OPT_STR, "None", storage=NAME),
    F("kv_transfer_tokens", OPT_INT, "None",
      "Prompt tokens whose KV cache crossed from the prefill engine to the decode engine,\n"
      "the bytes that took (tokens x the model's KV bytes per token; 0 when the model is\n"
      'not in the catalog) and how the count was had: "relayed" (the kv_transfer_params\n'
      'a proxy relayed) or "derived" (from the two engines\' spans).'),
    F("kv_transfer_bytes", OPT_INT, "None"),
    F("kv_transfer_source", OPT_STR, "None", storage=NAME),
)

# JSON keys that are not fields: (the field they follow, key, expression on ``self``).
DERIVED_JSON: Final[tuple[tuple[str, str, str], ...]] = (
    ("end_unix", "duration_seconds", "self.duration_seconds"),
)

FIELD_NAMES: Final[tuple[str, ...]] = tuple(f.name for f in FIELDS)
FIELDS_BY_NAME: Final[dict[str, RecordField]] = {f.name: f for f in FIELDS}

BEGIN_MARKER: Final = "    # --- generated from tokenpath/record_fields.py: do not edit by hand ---"
END_MARKER: Final = "    # --- end of the generated part ---"
RECORDS_PY: Final = Path(__file__).with_name("records.py")


# --- the generated code ---------------------------------------------------------------------


def _comment_lines(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}".rstrip() for line in text.splitlines()] if text else []


def _declaration_default(field: RecordField) -> str:
    if field.kind == STAGES or field.kind in (INT_MAP, FLOAT_MAP):
        return " = field(default_factory=dict)"
    return f" = {field.default}" if field.default else ""


def _parameter(field: RecordField) -> str:
    annotation = field.annotation
    if field.default == "None" and not field.optional:  # a mutable default, made per call
        annotation += " | None"
    default = f" = {field.default}" if field.default else ""
    return f"{field.name}: {annotation}{default}"


def _assignment(field: RecordField) -> str:
    if field.name == "record_id":
        return "self.record_id = record_id or trace_id"
    if field.default == "None" and not field.optional:
        return f"self.{field.name} = {{}} if {field.name} is None else {field.name}"
    return f"self.{field.name} = {field.name}"


def _to_json_value(field: RecordField) -> str:
    name = f"self.{field.name}"
    if field.kind == STR_TUPLE:
        return f"list({name})"
    if field.kind == STAGES:
        return "{PLAIN_VALUES[t.stage]: t.to_json() for t in self.ordered_stages()}"
    if field.kind in (INT_MAP, FLOAT_MAP):
        return f"dict({name})"
    return name


def _from_json_value(field: RecordField) -> str:
    key = f'"{field.name}"'
    get = f"data.get({key})"
    kind = field.kind
    if field.name == "trace_id":
        return 'str(data["trace_id"])'
    if field.name == "record_id":
        return 'str(data.get("record_id") or data["trace_id"])'
    if kind == STR:
        return f"str(data.get({key}, {field.default}))"
    if kind in (OPT_STR, OPT_BOOL):
        return get
    if kind == INT:
        return f"int({get} or {field.default})"
    if kind == OPT_INT:
        return f"_opt_int({get})"
    if kind == FLOAT:
        return f"float({get} or {field.default})"
    if kind == OPT_FLOAT:
        return f"_opt_float({get})"
    if kind == BOOL:
        return f"bool(data.get({key}, {field.default}))"
    if kind == STR_TUPLE:
        return f"tuple(str(t) for t in {get} or ())"
    if kind == STAGES:
        return ("{StageId(name): StageTiming.from_json(StageId(name), value)\n"
                f"{' ' * 20}for name, value in ({get} or {{}}).items()}}")
    if kind == INT_MAP:
        return f"{{str(k): int(v) for k, v in ({get} or {{}}).items()}}"
    if kind == FLOAT_MAP:
        return (f"{{str(k): float(v or 0.0)\n{' ' * 20}"
                f"for k, v in ({get} or {{}}).items()}}")
    raise ValueError(f"field {field.name}: unknown kind {kind!r}")


def generated_class_body() -> str:
    """The generated part of RequestRecord, markers included."""
    out = [BEGIN_MARKER]
    for f in FIELDS:
        out += _comment_lines(f.comment, "    ")
        out.append(f"    {f.name}: {f.annotation}{_declaration_default(f)}")
    out += ["", "    def __init__(", "        self,"]
    out += [f"        {_parameter(f)}," for f in FIELDS]
    out += ["    ) -> None:",
            '        """Every field, in declaration order, by position or by name."""']
    out += [f"        {_assignment(f)}" for f in FIELDS]
    out += ["", "    def to_json(self) -> dict[str, Any]:", "        return {"]
    derived = {after: (key, expr) for after, key, expr in DERIVED_JSON}
    for f in FIELDS:
        out.append(f'            "{f.name}": {_to_json_value(f)},')
        if f.name in derived:
            key, expr = derived[f.name]
            out.append(f'            "{key}": {expr},')
    out += ["        }", "", "    @classmethod",
            "    def from_json(cls, data: dict[str, Any]) -> RequestRecord:",
            "        return cls("]
    out += [f"            {f.name}={_from_json_value(f)}," for f in FIELDS]
    out += ["        )", END_MARKER]
    return "\n".join(out) + "\n"


def splice(source: str, body: str) -> str:
    """``source`` (records.py) with its generated part replaced by ``body``."""
    start = source.index(BEGIN_MARKER)
    end = source.index(END_MARKER, start) + len(END_MARKER) + 1
    return source[:start] + body + source[end:]


def generated_part(source: str) -> str:
    start = source.index(BEGIN_MARKER)
    end = source.index(END_MARKER, start) + len(END_MARKER) + 1
    return source[start:end]


def main(argv: list[str]) -> int:
    """Rewrite records.py's generated part; ``--check``: exit 1 when it is stale."""
    source = RECORDS_PY.read_text(encoding="utf-8")
    body = generated_class_body()
    if "--check" in argv:
        if generated_part(source) != body:
            print(f"{RECORDS_PY} is stale: run python -m tokenpath.record_fields")
            return 1
        return 0
    updated = splice(source, body)
    if updated != source:
        RECORDS_PY.write_text(updated, encoding="utf-8")
        print(f"rewrote the generated part of {RECORDS_PY}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
