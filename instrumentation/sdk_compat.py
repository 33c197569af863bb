"""The OpenTelemetry versions the shims' private fast paths are tested on, and the gate that
keeps those fast paths to them.

A few shims have a fast path that reads the OpenTelemetry SDK's (or its OTLP/HTTP
exporter's) private internals inside the host process: ``span_attributes``
(``BoundedAttributes._dict``), ``stage_recorder`` (``Span._events``) and ``otlp_exporter``
(the exporter's ``_client``, the batch processor's queue). Those internals are no API;
any release may change them. So each fast path runs only where the installed versions are
inside the range the project's tests run them on (``make test`` runs the shims' tests on
the oldest, ``scripts/otel_oldest_env.sh``, and on the newest, the project's venv):
:data:`TESTED_MIN` to :data:`TESTED_MAX`, both included. The versions are read once, at
import (``importlib.metadata``); outside the range (or with a version this module cannot
read, a pre-release or a local build included) every fast path is replaced by its public
API path, the replacement logged once, and each call of a replaced path counted in
``safety.sdk_version_fallbacks`` under the fast path's name. ``TOKENPATH_SDK_FAST_PATHS=off``
in the environment takes the public paths on any version (counted as well).

How a fast path is marked: it is a function decorated with :func:`fast_path`, which is
given the public path and returns, once, at import, either the function itself or the
counted public path; or it is code under ``if SDK_IN_TESTED_RANGE:`` (or
``EXPORTER_IN_TESTED_RANGE``). tests/instrumentation/test_sdk_private_use.py parses every
module under ``instrumentation/`` and fails on a private SDK read anywhere else. The
install requirements keep no upper bound: a newer SDK runs the public paths until the
range here is moved up, after the tests ran on it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable
from importlib import metadata
from typing import ParamSpec, TypeVar

from tokenpath.instrumentation.safety import sdk_version_fallbacks

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

# The tested range, both ends included: the oldest the install requirements allow (and
# scripts/otel_oldest_env.sh installs) and the newest the tests were last run on. Moving
# TESTED_MAX up is a claim that the shims' tests passed on that version.
TESTED_MIN: tuple[int, int, int] = (1, 30, 0)
TESTED_MAX: tuple[int, int, int] = (1, 45, 2)
# The distributions whose internals the fast paths read. The API package holds the
# attribute container (opentelemetry.attributes.BoundedAttributes); the three are
# released together, with one version.
SDK_DISTRIBUTIONS: tuple[str, ...] = ("opentelemetry-api", "opentelemetry-sdk")
EXPORTER_DISTRIBUTIONS: tuple[str, ...] = ("opentelemetry-exporter-otlp-proto-http",)
# "off" (or "0", "false", "no"): the public paths on any version
SWITCH_ENV = "TOKENPATH_SDK_FAST_PATHS"

_RELEASE = re.compile(r"\d+(\.\d+)*")


def parse_version(text: str) -> tuple[int, ...] | None:
    """The release numbers of a final release (``"1.45.2"`` -> ``(1, 45, 2)``), or None for
    anything else: a pre-release, a development or local build has no tested range."""
    if not _RELEASE.fullmatch(text):
        return None
    return tuple(int(part) for part in text.split("."))


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except Exception:  # not installed, or unreadable metadata
        return None


def in_tested_range(version: str | None) -> bool:
    release = None if version is None else parse_version(version)
    if release is None:
        return False
    padded = release + (0,) * (3 - len(release))
    return TESTED_MIN <= padded <= TESTED_MAX


def check(distributions: tuple[str, ...]) -> tuple[bool, str]:
    """(whether the fast paths may run with ``distributions`` as installed, why not)."""
    switch = os.environ.get(SWITCH_ENV, "").strip().lower()
    if switch in ("off", "0", "false", "no"):
        return False, f"{SWITCH_ENV}={switch}"
    outside = []
    for distribution in distributions:
        version = installed_version(distribution)
        if not in_tested_range(version):
            outside.append(f"{distribution} {version or 'not found'}")
    if outside:
        low, high = (".".join(map(str, end)) for end in (TESTED_MIN, TESTED_MAX))
        return False, f"{', '.join(outside)} (tested: {low} to {high})"
    return True, ""


# Read once, at import.
SDK_IN_TESTED_RANGE, SDK_OUTSIDE = check(SDK_DISTRIBUTIONS)
EXPORTER_IN_TESTED_RANGE, EXPORTER_OUTSIDE = check(SDK_DISTRIBUTIONS + EXPORTER_DISTRIBUTIONS)
# fast path -> whether it runs (for tests and diagnostics)
FAST_PATHS: dict[str, bool] = {}
_logged: set[str] = set()


def _log_once(reason: str) -> None:
    if reason in _logged:
        return
    _logged.add(reason)
    logger.warning("tokenpath: the shims use the public OpenTelemetry API instead of their "
                   "SDK fast paths: %s", reason)


def fast_path(name: str, public: Callable[P, R], *, exporter: bool = False,
              ) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Mark the decorated function as a fast path over private SDK internals (``exporter``:
    the OTLP/HTTP exporter's too) whose public path is ``public`` (same signature, same
    effect). Decided once, when the decorator runs (the module's import): the function
    itself inside the tested range; outside it ``public``, each call counted in
    ``sdk_version_fallbacks[name]``, the reason logged once."""
    allowed, reason = ((EXPORTER_IN_TESTED_RANGE, EXPORTER_OUTSIDE) if exporter
                       else (SDK_IN_TESTED_RANGE, SDK_OUTSIDE))

    def decide(func: Callable[P, R]) -> Callable[P, R]:
        FAST_PATHS[name] = allowed
        if allowed:
            return func
        _log_once(reason)
        count = sdk_version_fallbacks.count

        @functools.wraps(public)
        def counted(*args: P.args, **kwargs: P.kwargs) -> R:
            count(name)
            return public(*args, **kwargs)

        return counted

    return decide
