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
