"""The fake driver library (``libnvml/fake_libnvidia_ml.c``) under the real ``pynvml``.

:func:`build_fake_libnvml` compiles the C file with the system C compiler into a
directory holding ``libnvidia-ml.so.1`` (cached by source hash under ``build/``), so a
subprocess finds it with ``LD_LIBRARY_PATH`` exactly as pynvml finds the driver's.
:func:`real_pynvml_over_fake_library` loads it into this process's ``pynvml`` and puts
pynvml back as it was afterwards (its library, if it had loaded one, and its function
cache), so other tests still see the machine's own driver, or none.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().parent / "libnvml" / "fake_libnvidia_ml.c"
BUILD_ROOT = Path(__file__).resolve().parents[2] / "build" / "fake-libnvml"
LIBRARY_NAME = "libnvidia-ml.so.1"  # the name pynvml dlopens on Linux
ENV_GPUS = "FAKE_LIBNVML_GPUS"
ENV_FAILING = "FAKE_LIBNVML_FAILING"
ENV_NO_NVLINK = "FAKE_LIBNVML_NO_NVLINK"
ENV_NO_POWER = "FAKE_LIBNVML_NO_POWER"
ENV_NO_UTILIZATION = "FAKE_LIBNVML_NO_UTILIZATION"
# What the C fake reports, for tests to compare against (see the C file).
NVLINK_KIB_PER_READ = 1024
MEMORY_TOTAL_BYTES = 80 * 2**30
SM_CLOCK_MHZ = 1980


class CompilerMissing(RuntimeError):
    """No C compiler on this machine; ``scripts/install-system-deps.sh`` installs gcc."""


def utilization_percent(index: int) -> int:
    return (10 * (index + 1)) % 101


def memory_utilization_percent(index: int) -> int:
    return (5 * (index + 1)) % 101


def power_milliwatts(index: int) -> int:
    return 300_000 + 1000 * index


def pcie_bytes_per_read(index: int) -> tuple[int, int]:
    """TX and RX bytes the PCIe counters grow by on each field-values read."""
    return 1_000_000 * (index + 1), 2_000_000 * (index + 1)


def build_fake_libnvml(build_root: Path = BUILD_ROOT) -> Path:
    """The directory holding the compiled fake ``libnvidia-ml.so.1``."""
    source = SOURCE.read_bytes()
    directory = build_root / hashlib.sha256(source).hexdigest()[:16]
    library = directory / LIBRARY_NAME
    if library.exists():
        return directory
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise CompilerMissing("no C compiler (cc/gcc) to build the fake libnvidia-ml")
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{LIBRARY_NAME}.{os.getpid()}"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o",
                    str(partial), str(SOURCE)], check=True, capture_output=True)
    partial.replace(library)  # atomic: concurrent builders never load a half-written file
    return directory


def driver_env(gpus: int, *, failing: tuple[int, ...] = (), no_nvlink: tuple[int, ...] = (),
               no_power: tuple[int, ...] = (),
               no_utilization: tuple[int, ...] = ()) -> dict[str, str]:
    """Environment that configures the fake driver (read at ``nvmlInit``)."""
    return {
        ENV_GPUS: str(gpus),
        ENV_FAILING: ",".join(map(str, failing)),
        ENV_NO_NVLINK: ",".join(map(str, no_nvlink)),
        ENV_NO_POWER: ",".join(map(str, no_power)),
        ENV_NO_UTILIZATION: ",".join(map(str, no_utilization)),
    }


def _release_all_inits(library: ctypes.CDLL) -> None:
    """Shuts the fake driver down as often as it was initialised (its initialisation is
    reference counted, like the driver's, and lives as long as the process)."""
    while library.nvmlShutdown() == 0:
        pass


@contextmanager
def real_pynvml_over_fake_library(gpus: int, **options: tuple[int, ...]) -> Iterator[
        tuple[ModuleType, ctypes.CDLL]]:
    """The real ``pynvml`` module with the fake driver loaded, and the library handle
    (for ``fakeNvmlResetDevice``). Not initialised: the caller runs ``nvmlInit``."""
    import pynvml

    library = ctypes.CDLL(str(build_fake_libnvml() / LIBRARY_NAME))
    saved_library = pynvml.nvmlLib
    saved_functions = dict(pynvml._nvmlGetFunctionPointer_cache)
    saved_refcount = pynvml._nvmlLib_refcount
    saved = {key: os.environ.get(key) for key in (ENV_GPUS, ENV_FAILING, ENV_NO_NVLINK,
                                                  ENV_NO_POWER, ENV_NO_UTILIZATION)}
    os.environ.update(driver_env(gpus, **options))
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()
    _release_all_inits(library)  # the next nvmlInit reads the configuration above
    try:
        yield pynvml, library
    finally:
        _release_all_inits(library)  # a test that stopped before nvmlShutdown
        pynvml.nvmlLib = saved_library
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved_functions)
        pynvml._nvmlLib_refcount = saved_refcount
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
