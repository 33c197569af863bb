from __future__ import annotations

import math

from tokenpath.collector.cost.longcontext import spend_by_context_bucket
from tokenpath.records import RequestRecord


def _record(i: int, input_tokens: int, cost: float) -> RequestRecord:
    return RequestRecord(trace_id=f"{i:032x}", model="llama-3.1-8b", input_tokens=input_tokens,
                         output_tokens=10, cost_dollars=cost)


def test_spend_shares_by_bucket_and_attention_grows_with_context() -> None:
    records = [_record(1, 500, 1.0), _record(2, 1000, 1.0), _record(3, 50_000, 6.0)]
    buckets = spend_by_context_bucket(records)
    by_label = {b.bucket: b for b in buckets}
    assert by_label["0-2048"].requests == 2
    assert math.isclose(by_label["0-2048"].share_of_spend, 0.25)
    assert math.isclose(by_label["32768-131072"].share_of_spend, 0.75)
    assert math.isclose(sum(b.share_of_spend for b in buckets), 1.0)
    # the quadratic attention term takes a larger share of prefill at long context
    assert by_label["32768-131072"].attention_share > 5 * by_label["0-2048"].attention_share
    assert by_label["32768-131072"].to_json()["attention_share"] > 0.2
