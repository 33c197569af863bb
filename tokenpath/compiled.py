"""The compiled core: which modules the package's build compiles with mypyc, and the switch
that runs them as plain Python instead.

The collector's per-request work (mapping spans to stages, pricing over engine
timelines, the Prometheus sink) is the product's rules, and they change often; a second
implementation of them in C would be two authorities to keep in step. mypyc compiles
the same type-annotated source into C extension modules instead: one implementation,
whose annotations (checked by ``mypy --strict`` in ``make lint``) become native types.
``setup.py`` builds them where mypyc and a C compiler are found and ``TOKENPATH_COMPILE``
is not ``0``; elsewhere the package installs as plain Python and behaves the same
(docs/performance.md has what compiling buys, measured side by side).

``TOKENPATH_PURE_PYTHON=1`` in a process's environment makes it import the plain
``.py`` source of every compiled module even where the extension is built (the
benchmarks run such a collector beside the compiled one; a test checks both price the
same traffic to the same bytes). It must be set before ``tokenpath`` is first imported.
Which of the two a process runs is decided by :mod:`tokenpath.install_check`, which also
checks a built core once per install in a child process before trusting it.

This file is read by ``setup.py`` before anything is installed: it imports the standard
library only.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from pathlib import Path
from typing import Final

# The modules on the collector's per-span and per-request path, as import names. Each
# must be ``mypy --strict`` clean and must not be patched at run time (a compiled module
# calls its own functions directly).
COMPILED_MODULES: Final[tuple[str, ...]] = (
    "tokenpath.records",
    "tokenpath.identity",
    "tokenpath.roofline",
    "tokenpath.collector.assembler",
    "tokenpath.collector.spans",
    "tokenpath.collector.calls",
    "tokenpath.collector.mapping",
    "tokenpath.collector.disaggregated",
    "tokenpath.collector.call_join",
    "tokenpath.collector.prometheus_sink",
    "tokenpath.collector.exposition",
    "tokenpath.collector.cost.apportion",
    "tokenpath.collector.cost.watermark",
    "tokenpath.collector.cost.sources",
    "tokenpath.collector.cost.attributor",
    "tokenpath.collector.cost.cache",
    "tokenpath.collector.cost.energy",
    "tokenpath.collector.cost.stage_cost",
    "tokenpath.collector.cost.disaggregated_parts",
    "tokenpath.instrumentation.otlp_encoder",
)

# The shared library mypyc builds the modules into (each module's own extension is a
# small shim that loads its code from it, and is not rebuilt when only the code changes).
LIBRARY_GROUP: Final = "tokenpath.compiled_core"
PURE_PYTHON_ENV: Final = "TOKENPATH_PURE_PYTHON"
COMPILE_ENV: Final = "TOKENPATH_COMPILE"  # read by setup.py: "0" builds no extension at all


def is_extension(origin: str | None) -> bool:
    """Whether a module's file is a C extension (compiled) rather than Python source."""
    return origin is not None and origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def compiled_modules() -> list[str]:
    """The modules of :data:`COMPILED_MODULES` this process runs compiled (imports them)."""
    return [name for name in COMPILED_MODULES
            if is_extension(getattr(importlib.import_module(name), "__file__", None))]


def describe() -> str:
    """One line for start-up logs and benchmarks: how the per-request core runs."""
    compiled = compiled_modules()
    if len(compiled) == len(COMPILED_MODULES):
        return f"compiled (mypyc, {len(compiled)} modules)"
    if not compiled:
        reason = (f"{PURE_PYTHON_ENV}=1" if pure_python_requested()
                  else "the compiled core is not built")
        return f"pure Python ({reason})"
    return f"partly compiled ({len(compiled)} of {len(COMPILED_MODULES)} modules)"


def stale_modules() -> list[str]:
    """Compiled modules whose ``.py`` source changed after their extension was built (an
    in-place build left behind by an edit: it would run the old code). ``make venv``
    rebuilds them."""
    library = importlib.util.find_spec(LIBRARY_GROUP + "__mypyc")
    if library is None or library.origin is None:
        return []
    built = Path(library.origin).stat().st_mtime
    stale = []
    for name in COMPILED_MODULES:
        spec = importlib.util.find_spec(name)
        origin = None if spec is None else spec.origin
        if origin is None or not is_extension(origin):
            continue
        source = Path(origin).with_name(name.rpartition(".")[2] + ".py")
        if source.is_file() and source.stat().st_mtime > built:
            stale.append(name)
    return stale


def pure_python_requested() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "") == "1"
