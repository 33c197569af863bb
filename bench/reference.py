"""The reference figures: bench/reference_results.json rendered into the docs.

Each figure of bench/reference_results.json is the newest recorded measurement of one
performance figure: its value (a number, or the low and high of the runs it names), its
target, how and where it was measured. :func:`render_table` turns them into the markdown
table that docs/performance.md (every figure) and docs/agent.md (the agent's) carry
between ``<!-- figures:begin -->`` and ``<!-- figures:end -->`` markers;
``python -m bench reference`` rewrites those sections, ``--check`` exits 1 where one is
stale. A measured run updates the JSON file, never the tables by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS_FILE = REPO / "bench" / "reference_results.json"
# The docs that carry a table, relative to the repository root.
DOCS = (Path("docs/performance.md"), Path("docs/agent.md"))
GROUPS = ("collector", "store", "gateway", "agent", "attribution", "capacity")
SECTION = re.compile(
    r"(?P<begin><!-- figures:begin(?: group=(?P<group>[a-z]+))? -->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- figures:end -->)",
    re.DOTALL)
OPS = {"<=": "≤", ">=": "≥"}
Number = int | float
# Units written right after the number ("1.5x", "0.5%"); the others after a space.
TIGHT_UNITS = ("x", "%")


@dataclass(frozen=True)
class Figure:
    id: str
    group: str
    name: str
    value: Number | tuple[Number, Number] | None
    unit: str
    op: str | None
    limit: Number | None
    command: str | None
    method: str
    date: str | None
    at: str | None
    recorded_in: str | None
    modeled: bool
    bench_target: str | None

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> Figure:
        raw = entry["value"]
        value: Number | tuple[Number, Number] | None
        if isinstance(raw, list):
            low, high = raw
            value = (low, high)
        else:
            value = raw
        target = entry["target"]
        measured = entry["measured"] or {}
        return cls(id=entry["id"], group=entry["group"], name=entry["name"], value=value,
                   unit=entry["unit"], op=target["op"] if target else None,
                   limit=target["limit"] if target else None,
                   command=entry["command"], method=entry["method"],
                   date=measured.get("date"), at=measured.get("at"),
                   recorded_in=measured.get("recorded_in"),
                   modeled=bool(entry.get("modeled", False)),
                   bench_target=entry.get("bench_target"))

    def values(self) -> tuple[Number, ...]:
        if self.value is None:
            return ()
        return self.value if isinstance(self.value, tuple) else (self.value,)

    def holds(self) -> str:
        """yes, no, "in some runs" (a range across the target), "not recorded" or ""."""
        if self.op is None or self.limit is None:
            return ""
        values = self.values()
        if not values:
            return "not recorded"
        limit = self.limit
        ok = [v <= limit if self.op == "<=" else v >= limit for v in values]
        if all(ok):
            return "yes"
        return "in some runs" if any(ok) else "no"


def load(path: Path = RESULTS_FILE) -> list[Figure]:
    document = json.loads(path.read_text(encoding="utf-8"))
    return [Figure.from_json(entry) for entry in document["figures"]]


def _number(value: Number) -> str:
    """An int with thousands separators; a float as written in the file (0.151, 1.0),
    never in exponent form."""
    if isinstance(value, int):
        return f"{value:,}"
    text = repr(value)
    if "e" in text:
        text = format(value, "f").rstrip("0")
    whole, _, fraction = text.partition(".")
    return f"{int(whole):,}.{fraction}" if fraction else f"{int(whole):,}"


def _quantity(value: Number, unit: str) -> str:
    number = _number(value)
    if not unit:
        return number
    return f"{number}{unit}" if unit in TIGHT_UNITS else f"{number} {unit}"


def format_value(figure: Figure) -> str:
    values = figure.values()
    if not values:
        return "not recorded"
    if len(values) == 1 or figure.unit in TIGHT_UNITS:
        text = " to ".join(_quantity(v, figure.unit) for v in values)
    else:  # "103,360 to 125,000 spans/s"
        text = f"{_number(values[0])} to {_quantity(values[1], figure.unit)}"
    return f"{text} (modeled)" if figure.modeled else text


def format_target(figure: Figure) -> str:
    if figure.op is None or figure.limit is None:
        return ""
    return f"{OPS[figure.op]} {_quantity(figure.limit, figure.unit)}"


def format_measured(figure: Figure) -> str:
    if figure.date is None:
        return "computed" if figure.modeled else ""
    if figure.at:
        return f"{figure.date}, at {figure.at}"
    if figure.recorded_in:
        return f"{figure.date}, recorded in {figure.recorded_in}"
    return figure.date


def format_method(figure: Figure) -> str:
    return f"`{figure.command}`: {figure.method}" if figure.command else figure.method


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_table(figures: list[Figure] | None = None, group: str | None = None) -> str:
    """The markdown table of ``figures`` (default: the reference file's), one group's
    where ``group`` is given; it ends with a newline."""
    figures = load() if figures is None else figures
    chosen = [f for f in figures if group is None or f.group == group]
    lines = ["<!-- generated by `python -m bench reference` from "
             "bench/reference_results.json: edit that file, then run it -->",
             "| figure | value | target | holds | how measured | measured |",
             "|---|---|---|---|---|---|"]
    lines.extend(
        "| " + " | ".join(_cell(c) for c in (
            f.name, format_value(f), format_target(f), f.holds(), format_method(f),
            format_measured(f))) + " |"
        for f in chosen)
    return "\n".join(lines) + "\n"


def rendered_doc(text: str, figures: list[Figure] | None = None) -> str:
    """``text`` with every figures section replaced by what the reference file renders."""
    figures = load() if figures is None else figures

    def replace(match: re.Match[str]) -> str:
        body = render_table(figures, match.group("group"))
        return match.group("begin") + body + match.group("end")

    return SECTION.sub(replace, text)


def sections(text: str) -> list[tuple[str | None, str]]:
    """(group, table text) of each figures section in ``text``."""
    return [(m.group("group"), m.group("body")) for m in SECTION.finditer(text)]


def main(argv: list[str] | None = None, root: Path = REPO) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench reference",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 where a doc's table differs from the reference file")
    args = parser.parse_args(argv)
    figures = load()
    rewritten: dict[Path, str] = {}
    for relative in DOCS:
        text = (root / relative).read_text(encoding="utf-8")
        if not sections(text):
            print(f"{relative}: no <!-- figures:begin --> section", file=sys.stderr)
            return 1
        new = rendered_doc(text, figures)
        if new != text:
            rewritten[relative] = new
    if args.check:
        if rewritten:
            print("stale: " + ", ".join(map(str, rewritten))
                  + " (run `python -m bench reference`)", file=sys.stderr)
            return 1
        return 0
    for relative, new in rewritten.items():
        (root / relative).write_text(new, encoding="utf-8")
        print(f"rewrote the figures in {relative}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
