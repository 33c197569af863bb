"""The store bench's baseline: ``report --since 24h`` or ``chargeback --since 24h`` as the
code before the column layout ran them, over a store in the JSON layout. Every record of
the window is loaded (its JSON body parsed into a RequestRecord), then the record-list
functions (testkit/oracles) aggregate them. Prints the result's JSON, as the CLI does.

    python -m bench.store_baseline report|chargeback STORE
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from typing import Any

import orjson

from testkit.oracles.chargeback import chargeback
from testkit.oracles.leaks import rank_leaks
from testkit.oracles.report import build_report
from tokenpath.collector.cost.chargeback import IdlePolicy
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.records import RequestRecord


def encode_body(record: RequestRecord) -> str:
    """A record's JSON (the JSON layout's row body), by orjson; by the stdlib encoder for
    what orjson refuses (an integer past 64 bits, from a garbled token count)."""
    body = record.to_json()
    try:
        return orjson.dumps(body).decode()
    except TypeError:
        return json.dumps(body, separators=(",", ":"))


def decode_body(body: str | bytes) -> dict[str, Any]:
    """A row body back as JSON; the stdlib reader for what orjson refuses (``NaN``)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("store row body is not a JSON object")
    return data


def main(command: str, path: str) -> None:
    since = time.time() - 86_400.0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = db.execute("SELECT body FROM requests WHERE end_unix >= ? ORDER BY end_unix DESC",
                      (since,)).fetchall()
    records = [RequestRecord.from_json(decode_body(body)) for (body,) in rows]
    (idle,) = db.execute("SELECT COALESCE(SUM(dollars), 0) FROM idle_cost WHERE end_unix >= ?",
                         (since,)).fetchone()
    (joules,) = db.execute("SELECT COALESCE(SUM(energy_joules), 0) FROM idle_cost "
                           "WHERE end_unix >= ?", (since,)).fetchone()
    if command == "report":
        out = build_report(records, idle, joules).to_json()
        out["leaks_ranked"] = [leak.to_json() for leak in rank_leaks(
            records, load_price_sheet(None).network_dollars_per_byte)]
    else:
        rows_ = chargeback(records, idle, IdlePolicy.PROPORTIONAL, idle_energy_joules=joules)
        out = {"rows": [r.to_json() for r in rows_]}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
