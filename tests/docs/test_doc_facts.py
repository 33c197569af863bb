"""Doc lint: the facts the docs state that drifted from the code once, checked against it.

- docs/architecture.md's backpressure: the pipeline queue is unbounded and never makes a
  producer wait; the receivers shed at its high-water mark, ``pipeline_shed_at``; the doc
  names the constants and keys the code has, and says nothing of an assembler that waits
  on a full queue.
- The alert and recording rules the docs list are the ones the code generates.
- Every repository path the docs and the generated rule files cite exists in the checkout,
  and every anchor they point into (a runbook, a doc section) exists.
- The docs are reference text: no session diaries or numbered run logs.

Everything here reads files and calls functions; nothing starts a process.
"""

from __future__ import annotations

import itertools
import re
import threading
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from tokenpath.collector import backpressure
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.config import FILE_KEYS, CollectorConfig
from tokenpath.collector.pipeline_worker import DEFAULT_SHED_AT, PipelineWorker
from tokenpath.dashboards import budgets, generate, rules

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
ARCHITECTURE = DOCS / "architecture.md"
DOC_FILES = [*sorted(DOCS.glob("*.md")), REPO / "README.md"]
# The generated Prometheus rule files, as committed (tests/dashboards/test_generate.py
# holds them byte for byte to what the code writes).
RULE_FILES = (generate.RULES_FILE, generate.BUDGET_RULES_EXAMPLE_FILE,
              generate.PROMETHEUS_RULE_FILE)
# What docs may cite that a run writes and git ignores: make bench's output.
OUTPUTS = ("bench/results/",)
TOP_LEVEL = ("agent", "bench", "collector", "dashboards", "deploy", "docs", "fuzz",
             "instrumentation", "scripts", "tests", "tokenpath")
# A repository path: a top-level folder, a slash, then path characters (with {a,b}
# alternatives, * globs and <placeholders>), optionally a #anchor. Not preceded by what
# would make it part of a longer path or URL (/var/lib/tokenpath/..., http://.../docs/).
CITED_PATH = re.compile(
    r"(?<![\w./~:-])(?P<path>(?:" + "|".join(TOP_LEVEL) + r")/[\w./{},*<>-]*[\w}*>])"
    r"(?:#(?P<anchor>[\w-]+))?")
MD_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
ALERT_NAME = re.compile(r"`(Tokenpath[A-Z][A-Za-z0-9]*)`")
RECORD_NAME = re.compile(r"`([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)`")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _paragraph(text: str, opening: str) -> str:
    start = text.index(opening)
    end = text.find("\n\n", start)
    return text[start:] if end < 0 else text[start:end]


def _section(text: str, heading: str) -> str:
    """From ``heading`` (a whole line) to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    following = re.compile(r"\n#{1," + str(len(level)) + "} ")
    match = following.search(text, start + len(heading) + 2)
    return text[start:match.start() if match else len(text)]


# --- backpressure ---------------------------------------------------------------------


def test_the_pipeline_queue_never_makes_a_producer_wait_and_sheds_at_half_its_size() -> None:
    """What the doc describes, run: a put into the queue returns at once however deep it
    is, and admission sees the backlog from half of ``queue_size``."""
    release, busy = threading.Event(), threading.Event()

    class Stuck:
        def consume_trace(self, trace: AssembledTrace) -> None:
            busy.set()
            release.wait(10)

        def shutdown(self) -> None:
            pass

    shed_at = 2
    worker = PipelineWorker(Stuck(), None, shed_at=shed_at)  # type: ignore[arg-type]
    worker.start()
    try:
        worker.consume_trace(AssembledTrace("first", [], True))
        assert busy.wait(10)
        # Twenty times shed_at while the worker is stuck: a bounded queue would block.
        feeder = threading.Thread(target=lambda: [
            worker.consume_trace(AssembledTrace(f"t{i}", [], True))
            for i in range(20 * shed_at)])
        feeder.start()
        feeder.join(5)
        assert not feeder.is_alive(), "a put into the pipeline queue waited"
        backlog = worker.backlog()
        assert backlog.high_water == shed_at
        assert backlog.depth() == 20 * shed_at and backlog.over()
    finally:
        release.set()
        worker.shutdown()


def test_architecture_md_states_the_backpressure_the_code_does() -> None:
    text = _read(ARCHITECTURE)
    # What the code never does.
    for wrong in (r"assembler (?:waits|blocks)", r"waits? while the (?:pipeline )?queue is full",
                  r"one bounded queue", r"bounded\s+(?:pipeline )?queue \(`pipeline_queue"):
        assert not re.search(wrong, text, re.IGNORECASE), wrong
    assert "**Backpressure.**" in text, "architecture.md: no **Backpressure.** paragraph"
    paragraph = _paragraph(text, "**Backpressure.**")
    assert "unbounded" in paragraph
    # The high-water mark by the names the code has, and its default as a number.
    assert "`pipeline_shed_at`" in paragraph and f"{DEFAULT_SHED_AT:,}" in paragraph
    assert CollectorConfig().pipeline_shed_at == DEFAULT_SHED_AT
    assert "`HIGH_WATER_FRACTION`" in paragraph and "`store_queue_size`" in paragraph
    assert backpressure.HIGH_WATER_FRACTION == 0.5 and "one half" in paragraph
    # Every key, constant or metric the paragraph names exists.
    reference = _read(DOCS / "reference.md")
    for name in re.findall(r"`([a-z_]+|[A-Z_]+)`", paragraph):
        assert (name in FILE_KEYS or hasattr(backpressure, name) or f"`{name}`" in reference
                ), f"architecture.md's backpressure names {name}, which the code lacks"


def test_the_example_config_states_the_codes_defaults() -> None:
    block = re.search(r"```yaml\n(# collector\.yaml\n.*?)```", _read(ARCHITECTURE), re.DOTALL)
    assert block is not None
    example = yaml.safe_load(block.group(1))
    defaults = CollectorConfig()
    checked = 0
    for field in fields(CollectorConfig):
        value = example.get(field.name)
        if isinstance(value, int) and not isinstance(value, bool):
            assert value == getattr(defaults, field.name), field.name
            checked += 1
    assert checked >= 4  # max_buffered_spans, the three queue and batch sizes, ...


# --- rules ------------------------------------------------------------------------------


def _generated() -> tuple[set[str], set[str], set[str]]:
    """(alert names, recorded series) of tokenpath-rules.yml and the example budgets'
    alert names, from the code with the production defaults."""
    params = rules.RuleParams()
    document = rules.rule_groups(params)
    items = [r for g in document["groups"] for r in g["rules"]]
    example = budgets.budget_group(
        budgets.load_budgets(generate.SOURCE_ROOT / generate.BUDGETS_EXAMPLE), params)
    return ({r["alert"] for r in items if "alert" in r},
            {r["record"] for r in items if "record" in r},
            {r["alert"] for r in example["rules"] if "alert" in r})


def test_dashboards_md_lists_the_generated_rules() -> None:
    alerts, records, _ = _generated()
    section = _section(_read(DOCS / "dashboards.md"), "## Rules")
    assert set(ALERT_NAME.findall(section)) == alerts
    table = "\n".join(line for line in section.split("\n") if line.startswith("| `"))
    assert set(RECORD_NAME.findall(table)) == records


def test_runbooks_md_has_a_section_for_each_alert_at_its_runbook_anchor() -> None:
    alerts, _, budget_alerts = _generated()
    text = _read(DOCS / "runbooks.md")
    # Each section: an explicit anchor, then a heading naming its alerts.
    sections = re.findall(r'<a id="([a-z0-9-]+)"></a>\n## ([^\n]+)', text)
    by_alert = {name: anchor for anchor, heading in sections
                for name in re.findall(r"Tokenpath[A-Za-z0-9]+", heading)}
    assert set(by_alert) == alerts | budget_alerts
    params = rules.RuleParams()
    generated = [r for g in rules.rule_groups(params)["groups"] for r in g["rules"]]
    example = budgets.budget_group(
        budgets.load_budgets(generate.SOURCE_ROOT / generate.BUDGETS_EXAMPLE), params)
    for rule in generated + example["rules"]:
        if "alert" in rule:
            url = rule["annotations"]["runbook_url"]
            assert url == f"{rules.DEFAULT_RUNBOOK_BASE_URL}#{by_alert[rule['alert']]}", url


def test_chargeback_md_names_the_budget_rules() -> None:
    _, _, budget_alerts = _generated()
    text = _read(DOCS / "chargeback.md")
    assert set(ALERT_NAME.findall(text)) == budget_alerts
    assert f"`{budgets.BUDGET_SERIES}`" in text


# --- cited paths --------------------------------------------------------------------------


def _expand(path: str) -> list[str]:
    """``a/{b,c}.json`` -> ``a/b.json``, ``a/c.json``."""
    match = re.search(r"\{([^{}]*)\}", path)
    if match is None:
        return [path]
    return list(itertools.chain.from_iterable(
        _expand(path[:match.start()] + alternative + path[match.end():])
        for alternative in match.group(1).split(",")))


def _anchors(doc: Path) -> set[str]:
    """Explicit ``<a id>`` anchors and GitHub's heading slugs (duplicates get -1, -2)."""
    text = _read(doc)
    found = set(re.findall(r'<a id="([^"]+)"', text))
    seen: dict[str, int] = {}
    fenced = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def _missing_in(relative: Path) -> list[str]:
    text = _read(REPO / relative)
    missing = []
    for match in CITED_PATH.finditer(text):
        cited = match.group("path").rstrip(".")
        if "<" in cited or cited.startswith(OUTPUTS):
            continue
        for path in _expand(cited):
            found = sorted(REPO.glob(path)) if "*" in path else [REPO / path]
            if not any(p.exists() for p in found):
                missing.append(path)
            elif match.group("anchor") and path.endswith(".md") and (
                    match.group("anchor") not in _anchors(REPO / path)):
                missing.append(f"{path}#{match.group('anchor')}")
    return missing


@pytest.mark.parametrize("relative", [p.relative_to(REPO) for p in DOC_FILES] + list(RULE_FILES),
                         ids=str)
def test_every_cited_repository_path_exists(relative: Path) -> None:
    assert _missing_in(relative) == []


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.name)
def test_every_relative_link_and_its_anchor_exist(doc: Path) -> None:
    broken = []
    for match in MD_LINK.finditer(_read(doc)):
        target = match.group("target")
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # a URL
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists() or (
                anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            broken.append(target)
    assert broken == []


def test_the_path_check_catches_a_path_that_is_not_there() -> None:
    assert CITED_PATH.search("from tokenpath/dashboards/rules.py;")
    assert _expand("dashboards/grafana/{a,b}.json") == ["dashboards/grafana/a.json",
                                                        "dashboards/grafana/b.json"]
    assert not CITED_PATH.search("/var/lib/tokenpath/store.db")
    assert not CITED_PATH.search("http://example.com/docs/x.md")


# --- reference text, not run logs -----------------------------------------------------

SESSION_LANGUAGE = re.compile(
    r"this session|earlier session|later session|previous session|\bissue [A-Z]?\d+(/\d+)?\b"
    r"|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) run\b"
    r"|\brun [0-9]+\b|\bwave\b|\btoday\b|\bthis version\b|\bwe measured\b",
    re.IGNORECASE)


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.name)
def test_docs_read_as_reference_not_as_run_logs(doc: Path) -> None:
    hits = [m.group(0) for m in SESSION_LANGUAGE.finditer(_read(doc))]
    assert hits == [], f"{doc.name}: session language (history belongs in git): {hits}"
    assert "SPEC.md" not in _read(doc)
