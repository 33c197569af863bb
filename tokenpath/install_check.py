"""What this install runs: the compiled core (mypyc) or plain Python, the native OTLP
decoder (C) or protobuf's parser; checked once per install, in a child process.

A wrongly built extension does not fail politely: a compiled module built against other
types than the code was checked with can raise ``SystemError`` deep inside a library or
crash the process with a segmentation fault, which no ``try`` catches. So before this
process first imports a compiled module (or the native decoder), a child process imports
and exercises it (:mod:`tokenpath.install_selfcheck`: a vLLM-shaped trace decoded, mapped,
priced and rendered as Prometheus text). Its verdict is kept in a small file keyed by the
built files' identity (path, size, modification time), the Python version and the
``prometheus-client`` version, so each install is checked once; a rebuilt extension or an
upgraded dependency is checked again. Where a part fails its check, this process runs
the plain Python source of the compiled modules (or decodes with protobuf's parser), logs
why, and counts it in ``tokenpath_build_fallbacks_total{component,reason}``.

Environment:

- ``TOKENPATH_PURE_PYTHON=1``: run the plain Python core (reason ``disabled``).
- ``TOKENPATH_OTLP_DECODER=python``: decode with protobuf's parser (reason ``disabled``).
- ``TOKENPATH_INSTALL_CHECK=0``: trust the build, run no child check.
- ``TOKENPATH_CACHE_DIR``: where verdicts are kept (default ``$XDG_CACHE_HOME/tokenpath``
  or ``~/.cache/tokenpath``; the temporary directory when neither is writable).

This module imports the standard library only: ``tokenpath/__init__.py`` installs its
import hook before anything else of the package is imported.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Final

from tokenpath.compiled import COMPILED_MODULES, LIBRARY_GROUP, PURE_PYTHON_ENV, is_extension

log = logging.getLogger(__name__)

# Components and what each runs (the labels of tokenpath_build_info).
COMPONENT_CORE: Final = "core"
COMPONENT_DECODER: Final = "decoder"
CORE_COMPILED: Final = "compiled"
DECODER_NATIVE: Final = "native"
PYTHON: Final = "python"
# Why a component runs Python (the ``reason`` label of tokenpath_build_fallbacks_total).
REASON_NOT_BUILT: Final = "not_built"  # the install has no extension (no C compiler)
REASON_DISABLED: Final = "disabled"  # switched off by the environment
REASON_SELF_CHECK_FAILED: Final = "self_check_failed"  # the child check failed or crashed

CHECK_ENV: Final = "TOKENPATH_INSTALL_CHECK"  # "0": no check; "child": inside the check
CHECK_CHILD: Final = "child"
CACHE_DIR_ENV: Final = "TOKENPATH_CACHE_DIR"
DECODER_ENV: Final = "TOKENPATH_OTLP_DECODER"  # "python": protobuf's parser only
DECODER_MODULE: Final = "tokenpath.collector.receivers._otlp_native"
SELFCHECK_MODULE: Final = "tokenpath.install_selfcheck"
CHECK_TIMEOUT_SECONDS: Final = 300.0
# What a child prints on its last line when its part passed.
PASSED_LINE: Final = "tokenpath-install-check: passed"
VERDICT_FORMAT: Final = 1


@dataclass(frozen=True)
class Fallback:
    component: str
    reason: str
    detail: str


@dataclass(frozen=True)
class BuildState:
    """What this process runs, and why where it is not the built extension."""

    version: str
    core: str
    decoder: str
    fallbacks: tuple[Fallback, ...] = field(default=())

    def describe(self) -> str:
        """One line for ``tokenpath --version`` and the start-up logs."""
        return f"tokenpath {self.version} (core: {self.core}, decoder: {self.decoder})"


def package_version() -> str:
    try:
        return importlib.metadata.version("tokenpath")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _built_file(name: str) -> Path | None:
    """The extension file an import of ``name`` would load, or None where the install has
    none (imports ``name``'s parent packages, never ``name``)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = None if spec is None else spec.origin
    return Path(origin) if origin is not None and is_extension(origin) else None


def _cache_dirs() -> list[Path]:
    chosen = os.environ.get(CACHE_DIR_ENV)
    if chosen:
        return [Path(chosen)]
    xdg = os.environ.get("XDG_CACHE_HOME")
    home = Path(xdg) if xdg else Path.home() / ".cache"
    return [home / "tokenpath", Path(tempfile.gettempdir()) / f"tokenpath-{os.getuid()}"]


def _verdict_key(component: str, built: Path) -> str:
    stat = built.stat()
    try:
        prometheus = importlib.metadata.version("prometheus-client")
    except importlib.metadata.PackageNotFoundError:
        prometheus = "none"
    parts = (VERDICT_FORMAT, component, str(built.resolve()), stat.st_size, stat.st_mtime_ns,
             sys.version, sys.executable, prometheus)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def _read_verdict(key: str) -> dict[str, object] | None:
    for folder in _cache_dirs():
        try:
            loaded = json.loads((folder / f"install-check-{key}.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(loaded, dict) and isinstance(loaded.get("passed"), bool):
            return loaded
    return None


def _write_verdict(key: str, verdict: dict[str, object]) -> None:
    for folder in _cache_dirs():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            temporary = folder / f".install-check-{key}.{os.getpid()}"
            temporary.write_text(json.dumps(verdict))
            os.replace(temporary, folder / f"install-check-{key}.json")
            return
        except OSError:
            continue
    log.debug("tokenpath: no writable cache directory; the install check runs again next time")


def _exit_detail(returncode: int, output: str) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the check process was killed by {name}"
    last = [line for line in output.strip().splitlines() if line.strip()]
    tail = last[-1][:300] if last else "no output"
    return f"the check process exited {returncode}: {tail}"


def _start_child(component: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env[CHECK_ENV] = CHECK_CHILD
    if component == COMPONENT_DECODER:
        env[PURE_PYTHON_ENV] = "1"  # the decoder's check exercises the decoder alone
    else:
        env.pop(PURE_PYTHON_ENV, None)
    # -P: the working directory is not put on the child's path (a folder named tokenpath
    # there, a checkout, would be imported instead of the install under check)
    return subprocess.Popen(
        [sys.executable, "-P", "-m", SELFCHECK_MODULE, component], env=env, text=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _finish_child(child: subprocess.Popen[str]) -> tuple[bool, str]:
    try:
        output, _ = child.communicate(timeout=CHECK_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        child.kill()
        output, _ = child.communicate()
        return False, f"the check process did not finish in {CHECK_TIMEOUT_SECONDS:.0f} s"
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if child.returncode == 0 and lines and lines[-1] == PASSED_LINE:
        return True, "passed"
    return False, _exit_detail(child.returncode, output)


def run_checks(components: Sequence[tuple[str, Path]]) -> dict[str, tuple[bool, str]]:
    """Each component's verdict, from the cache or a child process (children run side by
    side); a child's verdict is cached."""
    results: dict[str, tuple[bool, str]] = {}
    pending: list[tuple[str, str, subprocess.Popen[str]]] = []
    for component, built in components:
        key = _verdict_key(component, built)
        cached = _read_verdict(key)
        if cached is not None:
            results[component] = (bool(cached["passed"]), str(cached.get("detail", "")))
            continue
        try:
            pending.append((component, key, _start_child(component)))
        except OSError as error:
            results[component] = (False, f"the check process did not start: {error}")
    for component, key, child in pending:
        passed, detail = _finish_child(child)
        results[component] = (passed, detail)
        _write_verdict(key, {"passed": passed, "detail": detail, "component": component})
    return results


@dataclass(frozen=True)
class _Part:
    """One built part: its extension, its switch, and what it runs when it is used."""

    component: str
    module: str  # the extension's import name
    disabled: bool  # switched off by the environment
    switch: str  # how it was switched off, for the fallback's detail
    running: str  # the build_info value when the built part runs
    missing: str


def _parts() -> tuple[_Part, ...]:
    return (
        _Part(COMPONENT_CORE, LIBRARY_GROUP + "__mypyc",
              os.environ.get(PURE_PYTHON_ENV, "") == "1", f"{PURE_PYTHON_ENV}=1",
              CORE_COMPILED, "the install has no compiled core (built without mypyc or "
              "without a C compiler)"),
        _Part(COMPONENT_DECODER, DECODER_MODULE,
              os.environ.get(DECODER_ENV, "").strip().lower() == PYTHON, f"{DECODER_ENV}=python",
              DECODER_NATIVE, "the install has no native OTLP decoder (built without a C "
              "compiler)"),
    )


def _decide() -> BuildState:
    fallbacks: list[Fallback] = []
    to_check: list[tuple[str, Path]] = []
    parts = _parts()
    for part in parts:
        built = None if part.disabled else _built_file(part.module)
        if part.disabled:
            fallbacks.append(Fallback(part.component, REASON_DISABLED, part.switch))
        elif built is None:
            fallbacks.append(Fallback(part.component, REASON_NOT_BUILT, part.missing))
        else:
            to_check.append((part.component, built))
    trusted = os.environ.get(CHECK_ENV, "") in ("0", CHECK_CHILD)
    verdicts = ({component: (True, "not checked") for component, _ in to_check} if trusted
                else run_checks(to_check))
    running = {part.component: PYTHON for part in parts}
    for part in parts:
        if part.component not in verdicts:
            continue
        passed, detail = verdicts[part.component]
        if passed:
            running[part.component] = part.running
        else:
            fallbacks.append(Fallback(part.component, REASON_SELF_CHECK_FAILED, detail))
    return BuildState(package_version(), running[COMPONENT_CORE], running[COMPONENT_DECODER],
                      tuple(fallbacks))


_lock = threading.Lock()
_state: BuildState | None = None


def build_state() -> BuildState:
    """This process's :class:`BuildState`, decided once (the first call may run the
    child checks of an install that has none cached)."""
    global _state
    with _lock:
        if _state is None:
            _state = _decide()
        return _state


def log_fallbacks(state: BuildState, component_name: str) -> None:
    """Say once, at a component's start, what runs as Python and why."""
    for fallback in state.fallbacks:
        level = logging.WARNING if fallback.reason == REASON_SELF_CHECK_FAILED else logging.INFO
        log.log(level, "%s: the %s runs as plain Python (%s): %s", component_name,
                "compiled core" if fallback.component == COMPONENT_CORE else "OTLP decoder",
                fallback.reason, fallback.detail)


class _CheckedCoreFinder(importlib.abc.MetaPathFinder):
    """Before the first compiled module is imported, decides whether this process runs
    the compiled core; where it does not, finds each compiled module's ``.py`` source
    ahead of its extension."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = frozenset(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._names or not path:
            return None
        if build_state().core == CORE_COMPILED:
            return None  # the regular finders load the extension
        leaf = fullname.rpartition(".")[2] + ".py"
        for folder in path:
            source = Path(folder) / leaf
            if source.is_file():
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def install_import_hook() -> None:
    """Route the compiled modules' imports through the install check (idempotent)."""
    if not any(isinstance(f, _CheckedCoreFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckedCoreFinder(COMPILED_MODULES))


def decoder_usable() -> bool:
    """Whether this process may load the native OTLP decoder."""
    return build_state().decoder == DECODER_NATIVE
