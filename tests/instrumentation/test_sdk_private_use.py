"""No shim touches the OpenTelemetry SDK's private internals outside a version-guarded
fast path (instrumentation/sdk_compat.py).

Every module under ``instrumentation/`` is parsed (``ast``) and these are flagged:

- constructing or subclassing an SDK span class (``opentelemetry.sdk.trace._Span``,
  ``Span``, ``ReadableSpan``);
- importing a private OpenTelemetry module or name (``..._common``, ``_Span``), by an
  import statement or ``importlib.import_module``;
- reading or writing a private name (one leading underscore; not ``__dunder__`` nor an
  Enum's ``_sunder_``) on anything but the module's own objects: ``x._name``,
  ``getattr(x, "_name")`` (``hasattr``, ``setattr``, ``delattr``,
  ``operator.attrgetter``), ``x.__dict__``, ``vars(x)``. ``self``/``cls`` are the
  module's own only for the names their class defines (assigned, declared in
  ``__slots__``, or from a base class of the same module): a subclass of an SDK class
  reading the SDK's ``self._client`` is flagged, and so is ``super()._x``. A name bound to
  a class of the module (``Klass._x``) is its own;

unless the code is inside a fast path: a function decorated with
``sdk_compat.fast_path(...)`` (which swaps in the public path, once, outside the tested
versions) or the body, not the ``else``, of ``if SDK_IN_TESTED_RANGE:`` /
``if EXPORTER_IN_TESTED_RANGE:`` (either may be one operand of an ``and``), the names
resolved through the module's imports to sdk_compat's own.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tokenpath.instrumentation import sdk_compat
from tokenpath.instrumentation.safety import sdk_version_fallbacks

REPO = Path(__file__).resolve().parents[2]
INSTRUMENTATION = REPO / "instrumentation"
PACKAGE = "tokenpath.instrumentation"
COMPAT = f"{PACKAGE}.sdk_compat"
FAST_PATH_DECORATOR = f"{COMPAT}.fast_path"
GUARD_FLAGS = frozenset({f"{COMPAT}.SDK_IN_TESTED_RANGE", f"{COMPAT}.EXPORTER_IN_TESTED_RANGE"})
SDK_SPAN_CLASSES = frozenset({"opentelemetry.sdk.trace._Span", "opentelemetry.sdk.trace.Span",
                              "opentelemetry.sdk.trace.ReadableSpan"})
ATTRIBUTE_FUNCTIONS = frozenset({"getattr", "hasattr", "setattr", "delattr"})
IMPORTERS = frozenset({"importlib.import_module", "__import__"})


def _private(name: str) -> bool:
    """One leading underscore (or a mangled ``__x``): not ``__dunder__``/``_sunder_``."""
    return name.startswith("_") and not name.endswith("_")


def _private_module(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "opentelemetry" and any(_private(part) for part in parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(INSTRUMENTATION).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


@dataclass
class _Class:
    own: set[str]  # the names the class (and its bases of the same module) defines
    foreign_bases: bool  # a base class from another module


@dataclass
class Checker(ast.NodeVisitor):
    module: str
    path: str
    is_package: bool = False
    imports: dict[str, str] = field(default_factory=dict)  # local name -> qualified name
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)  # the module's classes
    found: list[str] = field(default_factory=list)
    guarded_reads: int = 0  # private reads inside fast paths (to show the test sees them)
    _guarded: bool = False
    _class_stack: list[_Class] = field(default_factory=list)

    def check(self, tree: ast.Module) -> list[str]:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                self._bind(node)
        self.classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        self.visit(tree)
        return self.found

    # names
    def _package(self, level: int) -> list[str]:
        parts = self.module.split(".")
        keep = len(parts) - level + (1 if self.is_package else 0)
        return parts[:keep]

    def _from_module(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        return ".".join(self._package(node.level) + ([node.module] if node.module else []))

    def _bind(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.imports[alias.asname] = alias.name
                else:
                    self.imports[alias.name.split(".")[0]] = alias.name.split(".")[0]
            return
        base = self._from_module(node)
        for alias in node.names:
            self.imports[alias.asname or alias.name] = f"{base}.{alias.name}"

    def qualified(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            if node.id in self.imports:
                return self.imports[node.id]
            return f"{self.module}.{node.id}"
        if isinstance(node, ast.Attribute):
            base = self.qualified(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def _flag(self, node: ast.AST, what: str) -> None:
        if self._guarded:
            self.guarded_reads += 1
        else:
            self.found.append(f"{self.path}:{getattr(node, 'lineno', 0)}: {what}")

    # fast paths
    def _is_fast_path(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        return any(isinstance(d, ast.Call) and self.qualified(d.func) == FAST_PATH_DECORATOR
                   for d in node.decorator_list)

    def _is_guard(self, test: ast.expr) -> bool:
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return any(self._is_guard(value) for value in test.values)
        return isinstance(test, ast.Name | ast.Attribute) and self.qualified(test) in GUARD_FLAGS

    def _visit_guarded(self, nodes: list[ast.stmt]) -> None:
        before, self._guarded = self._guarded, True
        for node in nodes:
            self.visit(node)
        self._guarded = before

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if not self._is_fast_path(node):
            self.generic_visit(node)
            return
        for part in (*node.decorator_list, node.args, *([node.returns] if node.returns else [])):
            self.visit(part)
        self._visit_guarded(node.body)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        if self._is_guard(node.test):
            self._visit_guarded(node.body)
        else:
            for child in node.body:
                self.visit(child)
        for child in node.orelse:
            self.visit(child)

    # classes
    def _own_names(self, node: ast.ClassDef, seen: set[str]) -> tuple[set[str], bool]:
        own: set[str] = set()
        foreign = False
        for base in node.bases:
            local = base.id if isinstance(base, ast.Name) and base.id in self.classes else None
            if local is not None and local not in seen:
                names, base_foreign = self._own_names(self.classes[local], seen | {local})
                own |= names
                foreign = foreign or base_foreign
            elif not (isinstance(base, ast.Name) and base.id == "object"):
                foreign = True
        for item in ast.walk(node):  # attributes the class's methods set on self/cls
            if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store) and \
                    isinstance(item.value, ast.Name) and item.value.id in ("self", "cls"):
                own.add(item.attr)
        for item in node.body:  # the class body's own names (not its methods' locals)
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(item.name)
            targets = (item.targets if isinstance(item, ast.Assign)
                       else [item.target] if isinstance(item, ast.AnnAssign) else [])
            for target in targets:
                own |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                value = getattr(item, "value", None)
                if isinstance(target, ast.Name) and target.id == "__slots__" and value:
                    own |= {c.value for c in ast.walk(value)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        return own, foreign

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            if self.qualified(base) in SDK_SPAN_CLASSES:
                self._flag(base, f"subclasses the SDK span class {self.qualified(base)}")
        own, foreign = self._own_names(node, {node.name})
        self._class_stack.append(_Class(own, foreign))
        self.generic_visit(node)
        self._class_stack.pop()

    # the checks
    def _owner_allows(self, owner: ast.expr, name: str) -> bool:
        """Whether ``owner.<name>`` (a private name) is the module's own."""
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            if not self._class_stack:
                return False
            cls = self._class_stack[-1]
            return name in cls.own or not cls.foreign_bases
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and \
                owner.func.id == "super":
            return bool(self._class_stack) and not self._class_stack[-1].foreign_bases
        return isinstance(owner, ast.Name) and owner.id in self.classes

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "__dict__" and not self._owner_allows(node.value, "__dict__"):
            self._flag(node, f"reads {ast.unparse(node)}")
        elif _private(node.attr) and not self._owner_allows(node.value, node.attr):
            self._flag(node, f"private name {ast.unparse(node)}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        callee = self.qualified(node.func)
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if callee in SDK_SPAN_CLASSES:
            self._flag(node, f"constructs the SDK span class {callee}")
        if name in ATTRIBUTE_FUNCTIONS and len(node.args) >= 2:
            key = node.args[1]
            if (isinstance(key, ast.Constant) and isinstance(key.value, str)
                    and _private(key.value) and not self._owner_allows(node.args[0], key.value)):
                self._flag(node, f"private name through {ast.unparse(node)}")
        if callee == "operator.attrgetter" and any(
                isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                and any(_private(part) for part in arg.value.split(".")) for arg in node.args):
            self._flag(node, f"private name through {ast.unparse(node)}")
        if name == "vars" and node.args and not self._owner_allows(node.args[0], "__dict__"):
            self._flag(node, f"reads {ast.unparse(node)}")
        if (callee in IMPORTERS or name == "__import__") and node.args:
            target = node.args[0]
            if isinstance(target, ast.Constant) and isinstance(target.value, str) and \
                    _private_module(target.value):
                self._flag(node, f"imports the private module {target.value}")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _private_module(alias.name):
                self._flag(node, f"imports the private module {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._from_module(node)
        if _private_module(base):
            self._flag(node, f"imports from the private module {base}")
        elif base.split(".")[0] == "opentelemetry":
            for alias in node.names:
                if _private(alias.name):
                    self._flag(node, f"imports the private name {base}.{alias.name}")


def check_source(source: str, module: str = f"{PACKAGE}.synthetic",
                 path: str = "synthetic.py", is_package: bool = False) -> Checker:
    checker = Checker(module, path, is_package)
    checker.check(ast.parse(source))
    return checker


def _modules() -> list[Path]:
    return sorted(INSTRUMENTATION.rglob("*.py"))


def test_no_shim_touches_sdk_internals_outside_a_fast_path() -> None:
    found: list[str] = []
    for path in _modules():
        checker = check_source(path.read_text(), module_name(path),
                               str(path.relative_to(REPO)), path.name == "__init__.py")
        found += checker.found
    assert found == []


def test_the_fast_paths_are_seen_by_the_check() -> None:
    """Not vacuous: the known fast paths' private reads are found, inside their guards."""
    for name in ("span_attributes.py", "stage_recorder.py", "otlp_exporter.py"):
        path = INSTRUMENTATION / name
        checker = check_source(path.read_text(), module_name(path), name)
        assert checker.found == [] and checker.guarded_reads >= 2, name


GUARDED_FUNCTION = """
from tokenpath.instrumentation.sdk_compat import fast_path

def public(span):
    pass

@fast_path("x", public)
def fast(span):
    {line}
"""


@pytest.mark.parametrize("line", [
    "span._events.append(1)",
    "return getattr(span, '_lock', None)",
    "span._attributes._dict['k'] = 1",
    "from opentelemetry.sdk.trace import _Span; _Span('x', None)",
    "from opentelemetry.exporter.otlp.proto.http import _common",
    "import importlib; importlib.import_module('opentelemetry.sdk.trace._x')",
    "return vars(span)",
])
def test_each_private_use_is_flagged_outside_and_not_inside_a_fast_path(line: str) -> None:
    inside = GUARDED_FUNCTION.format(line=line)
    assert check_source(inside).found == []
    outside = inside.replace('@fast_path("x", public)\n', "")
    assert len(check_source(outside).found) >= 1, outside


@pytest.mark.parametrize("source", [
    "from opentelemetry.sdk.trace import _Span\n",
    "import opentelemetry.exporter.otlp.proto.http._common\n",
    "from opentelemetry.sdk import trace\nspan = trace.Span('x', None)\n",
    "import opentelemetry.sdk.trace\nspan = opentelemetry.sdk.trace.Span('x', None)\n",
    "from opentelemetry.sdk.trace import ReadableSpan as R\nR(name='x')\n",
    "from opentelemetry.sdk.trace import Span\nclass Mine(Span):\n    pass\n",
    "def f(span):\n    return span._events\n",
    "def f(span):\n    span.__dict__['_events'] = []\n",
    "def f(span):\n    setattr(span, '_end_time', 1)\n",
    "import operator\nevents = operator.attrgetter('_events')\n",
    # a subclass of an SDK class reading the SDK's private state
    "from opentelemetry.sdk.trace.export import BatchSpanProcessor\n"
    "class P(BatchSpanProcessor):\n    def f(self):\n        return self._batch_processor\n",
    "from opentelemetry.sdk.trace.export import BatchSpanProcessor\n"
    "class P(BatchSpanProcessor):\n    def f(self):\n        return super()._x\n",
    # a method's local of the same name is not the class's own
    "from opentelemetry.sdk.trace.export import BatchSpanProcessor\n"
    "class P(BatchSpanProcessor):\n    def f(self):\n        _lock = 1\n"
    "        return self._lock\n",
    "from opentelemetry.sdk.trace.export import BatchSpanProcessor\n"
    "class P(BatchSpanProcessor):\n    def f(self):\n        return getattr(self, '_x', 0)\n",
    # the else of a guard, a negated guard, a look-alike flag or decorator
    "from tokenpath.instrumentation.sdk_compat import SDK_IN_TESTED_RANGE\n"
    "def f(span):\n    if SDK_IN_TESTED_RANGE:\n        pass\n    else:\n        span._events\n",
    "from tokenpath.instrumentation.sdk_compat import SDK_IN_TESTED_RANGE\n"
    "def f(span):\n    if not SDK_IN_TESTED_RANGE:\n        span._events\n",
    "from tokenpath.instrumentation.sdk_compat import SDK_IN_TESTED_RANGE\n"
    "def f(span):\n    if SDK_IN_TESTED_RANGE or span:\n        span._events\n",
    "SDK_IN_TESTED_RANGE = True\ndef f(span):\n    if SDK_IN_TESTED_RANGE:\n        span._events\n",
    "from somewhere import fast_path\n@fast_path('x', print)\ndef f(span):\n    span._events\n",
    "from tokenpath.instrumentation.sdk_compat import fast_path\n"
    "@fast_path('x', lambda span: span._events)\ndef f(span):\n    pass\n",
])
def test_these_are_flagged(source: str) -> None:
    assert check_source(source).found != [], source


@pytest.mark.parametrize("source", [
    "class Own:\n    __slots__ = ('_x',)\n    def f(self, other):\n        return self._x\n",
    "class Own:\n    _registry = {}\ndef f():\n    return Own._registry\n",
    "from opentelemetry.sdk.trace.export import BatchSpanProcessor\n"
    "class P(BatchSpanProcessor):\n    def __init__(self):\n        self._mine = 1\n"
    "    def f(self):\n        return self._mine\n",
    "from tokenpath.instrumentation import sdk_compat\n"
    "def f(span):\n    if sdk_compat.SDK_IN_TESTED_RANGE and span:\n        span._events\n",
    "from tokenpath.instrumentation.sdk_compat import EXPORTER_IN_TESTED_RANGE\n"
    "if EXPORTER_IN_TESTED_RANGE:\n"
    "    from opentelemetry.exporter.otlp.proto.http import _common\n",
    "from .sdk_compat import fast_path\n@fast_path('x', print)\ndef f(span):\n    span._events\n",
    "import enum\ndef f(kind):\n    return kind._value_\n",
    "from opentelemetry.trace import NonRecordingSpan, INVALID_SPAN_CONTEXT\n"
    "span = NonRecordingSpan(INVALID_SPAN_CONTEXT)\n",
])
def test_these_are_not_flagged(source: str) -> None:
    assert check_source(source).found == [], source


def test_an_unguarded_private_read_added_to_the_gateway_shim_is_flagged() -> None:
    path = INSTRUMENTATION / "gateway.py"
    source = path.read_text()
    anchor = "            recorder.flush()\n"
    assert source.count(anchor) == 1
    tampered = source.replace(anchor, anchor + "            request.span._events.clear()\n")
    checker = check_source(tampered, module_name(path), "gateway.py")
    assert len(checker.found) == 1 and "span._events" in checker.found[0]
    assert check_source(source, module_name(path), "gateway.py").found == []


# The marking is honest: fast_path decides once, and outside the range never runs the
# function it decorates.
def test_fast_path_is_the_function_itself_inside_the_tested_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sdk_compat, "SDK_IN_TESTED_RANGE", True)

    def public(x: int) -> int:
        return -x

    def fast(x: int) -> int:
        return x

    assert sdk_compat.fast_path("test.inside", public)(fast) is fast
    assert sdk_compat.FAST_PATHS["test.inside"] is True


def test_outside_the_tested_range_the_public_path_runs_counted_and_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(sdk_compat, "EXPORTER_IN_TESTED_RANGE", False)
    monkeypatch.setattr(sdk_compat, "EXPORTER_OUTSIDE", "opentelemetry-sdk 9.0.0 (test)")
    monkeypatch.setattr(sdk_compat, "_logged", set())
    ran: list[str] = []

    def public(x: int) -> int:
        ran.append("public")
        return -x

    def fast(x: int) -> int:  # pragma: no cover - must not run
        ran.append("fast")
        return x

    before = sdk_version_fallbacks.by_place().get("test.outside", 0)
    with caplog.at_level("WARNING", logger=sdk_compat.__name__):
        chosen = sdk_compat.fast_path("test.outside", public, exporter=True)(fast)
        again = sdk_compat.fast_path("test.outside2", public, exporter=True)(fast)
    assert chosen(3) == -3 and again(4) == -4 and chosen(5) == -5
    assert ran == ["public"] * 3
    assert sdk_version_fallbacks.by_place()["test.outside"] == before + 2
    assert sdk_compat.FAST_PATHS["test.outside"] is False
    assert [r.getMessage().count("9.0.0") for r in caplog.records] == [1]  # logged once


@pytest.mark.parametrize(("version", "inside"), [
    ("1.30.0", True), ("1.30", True), ("1.45.2", True), ("1.38.1", True),
    ("1.29.9", False), ("1.45.3", False), ("1.46.0", False), ("2.0.0", False),
    ("1.40.0rc1", False), ("1.40.0.dev0", False), ("1.40.0+local", False), ("", False),
    (None, False),
])
def test_the_tested_range(version: str | None, inside: bool) -> None:
    assert sdk_compat.TESTED_MIN == (1, 30, 0)
    assert sdk_compat.in_tested_range(version) is inside


def test_the_switch_turns_every_fast_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sdk_compat.SWITCH_ENV, "off")
    allowed, reason = sdk_compat.check(sdk_compat.SDK_DISTRIBUTIONS)
    assert not allowed and sdk_compat.SWITCH_ENV in reason
    monkeypatch.delenv(sdk_compat.SWITCH_ENV)
    allowed, reason = sdk_compat.check(("no-such-distribution-tokenpath",))
    assert not allowed and "not found" in reason
