"""``tokenpath whatif`` flags."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tokenpath.cli.main import app
from tokenpath.records import RequestRecord


def test_a_zero_spec_decode_speedup_is_refused_not_read_as_none(tmp_path: Path) -> None:
    records = tmp_path / "records.json"
    records.write_text(json.dumps([
        RequestRecord(trace_id=format(i + 1, "032x"), start_unix=100.0 + i, end_unix=101.0 + i,
                      input_tokens=100, output_tokens=20).to_json() for i in range(5)]))
    for speedup in ("0", "-1"):
        result = CliRunner().invoke(app, ["whatif", "--records", str(records),
                                          "--spec-decode-speedup", speedup])
        assert result.exit_code == 2
        assert "--spec-decode-speedup must be > 0" in result.output
    result = CliRunner().invoke(app, ["whatif", "--records", str(records),
                                      "--spec-decode-speedup", "2", "--format", "json"])
    assert result.exit_code == 0, result.output


def test_since_counts_back_from_until_and_the_table_labels_its_units(tmp_path: Path) -> None:
    records = tmp_path / "records.json"
    records.write_text(json.dumps([
        RequestRecord(trace_id=format(i + 1, "032x"), start_unix=100.0 + i, end_unix=101.0 + i,
                      input_tokens=400, output_tokens=20, cache_read_tokens=100).to_json()
        for i in range(10)]))

    def run(*flags: str) -> dict[str, object]:
        result = CliRunner().invoke(app, ["whatif", "--records", str(records), *flags,
                                          "--format", "json"])
        assert result.exit_code == 0, result.output
        out: dict[str, object] = json.loads(result.output)
        return out

    window = run("--since", "4s", "--until", "107")["window"]
    assert window == {"since": "4s", "since_unix": 103.0, "until_unix": 107.0, "records": 5}
    assert run("--until", "105.5")["window"]["records"] == 5  # type: ignore[index]
    result = CliRunner().invoke(app, ["whatif", "--records", str(records), "--until", "nan"])
    assert result.exit_code != 0 and "--until" in result.output
    # no fingerprints: any prompt token but the last may be cached; ratios move in points
    table = CliRunner().invoke(app, ["whatif", "--records", str(records),
                                     "--cache-hit-rate", "+0.10"])
    assert table.exit_code == 0, table.output
    assert "+10.0 pp" in table.output and "% relative" in table.output
    capped = CliRunner().invoke(app, ["whatif", "--records", str(records),
                                      "--cache-hit-rate", "+0.90"])
    assert "+90.0 pp asked" in capped.output and "pp possible: only" in capped.output
