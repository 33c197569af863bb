"""Reads the few sample lines the agent wants from a Prometheus text page, cheaply.

An engine page is mostly histogram buckets the agent ignores. :func:`iter_samples` keeps
only lines whose metric name starts with one of the wanted prefixes, then parses each
``name{label="value",...} value [timestamp]`` line with a small parser (about 2 us a line
against about 14 us for ``prometheus_client``'s, measured in ``bench/agent_bench.py``'s
setting); an OpenMetrics exemplar after the value (`` # {trace_id="..."} 1``) is cut off
first. A line the fast parser does not accept is handed to
``prometheus_client.parser.text_string_to_metric_families``, which either parses it or
raises ``ValueError``: the reference parser stays the judge of odd input, and tests check
that both agree on every line they both accept.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, dict[str, str], float]

_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _UNESCAPED.get(m.group(1), "\\" + m.group(1)), value)


def _cut_exemplar(line: str) -> str:
    """The line up to its first ``#`` after the label set: an OpenMetrics exemplar's own
    label set would otherwise be read as the sample's. A ``#`` inside a quoted label value
    is not a marker."""
    brace = line.find("{")
    marker = line.find("#")
    if brace == -1 or marker < brace:
        return line[:marker]
    position = brace + 1
    while (match := _LABEL.match(line, position)) is not None:  # skip the quoted values
        position = match.end()
        if not line.startswith(",", position):
            break
        position += 1
    end = line.find("}", position)
    marker = line.find("#", end + 1) if end != -1 else -1
    return line if marker == -1 else line[:marker]


def parse_sample_line(line: str) -> Sample:
    """``(name, labels, value)`` of one exposition sample line; ``ValueError`` if the fast
    path does not accept it."""
    if "#" in line:
        line = _cut_exemplar(line)
    brace = line.find("{")
    if brace == -1:
        parts = line.split()
        if len(parts) not in (2, 3):
            raise ValueError(f"not a sample line: {line!r}")
        return parts[0], {}, float(parts[1])
    name = line[:brace].strip()
    end = line.rfind("}")
    if end < brace or not name:
        raise ValueError(f"not a sample line: {line!r}")
    labels: dict[str, str] = {}
    body = line[brace + 1:end]
    position = 0
    while position < len(body):
        match = _LABEL.match(body, position)
        if match is None:
            raise ValueError(f"bad labels: {line!r}")
        labels[match.group(1)] = _unescape(match.group(2))
        position = match.end()
        if position < len(body):
            if body[position] != ",":
                raise ValueError(f"bad labels: {line!r}")
            position += 1
    rest = line[end + 1:].split()
    if len(rest) not in (1, 2):
        raise ValueError(f"not a sample line: {line!r}")
    return name, labels, float(rest[0])


def iter_samples(text: str, prefixes: tuple[str, ...]) -> Iterator[Sample]:
    """Samples of the lines starting with ``prefixes`` (comments never do). Lines end at
    ``\n`` only: ``str.splitlines`` would also split inside label values at \x1e,
    \x85, \u2028 and friends."""
    for line in text.split("\n"):
        if not line.startswith(prefixes):
            continue
        try:
            yield parse_sample_line(line)
        except ValueError:
            for family in text_string_to_metric_families(line):
                for sample in family.samples:
                    yield sample.name, dict(sample.labels), float(sample.value)
