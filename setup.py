"""Maps the top-level folders onto the ``tokenpath.*`` import namespace (SPEC section 3).

``collector/`` installs as ``tokenpath.collector`` and so on, so that a generic top-level
package named ``collector`` or ``agent`` never lands in a user's environment.
"""

import os
import runpy
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup

NAMESPACE_ROOTS = {
    "tokenpath": "tokenpath",
    "tokenpath.collector": "collector",
    "tokenpath.agent": "agent",
    "tokenpath.instrumentation": "instrumentation",
    "tokenpath.dashboards": "dashboards",
}

# Folders of data files, installed as data-only packages (declared, so setuptools does
# not warn that it would ignore them).
PACKAGE_DATA = {
    "tokenpath.data": ["*.yaml"],
    "tokenpath.dashboards.grafana": ["*.json"],
    "tokenpath.dashboards.rules": ["*.yml"],
    "tokenpath.dashboards.rules.tests": ["*.yml"],
    "tokenpath.collector.ui.static": ["*"],
}

packages: list[str] = []
for package, folder in NAMESPACE_ROOTS.items():
    packages.append(package)
    packages.extend(f"{package}.{sub}" for sub in find_packages(folder))
packages.extend(p for p in PACKAGE_DATA if p not in packages)

# The compiled OTLP trace decoder (docs/performance.md). Optional: where no C compiler
# is found the build goes on without it and the collector decodes with the pure-Python
# reference decoder, which the compiled one is fuzzed against.
NATIVE_EXTENSIONS = [
    Extension(
        "tokenpath.collector.receivers._otlp_native",
        ["collector/receivers/_otlp_native.c"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
]


def _installed_layout(root: Path) -> Path:
    """A tree of symlinks with the installed layout (``tokenpath/collector/...``), so that
    mypy names each module as it is imported; returns its ``tokenpath`` folder."""
    tree = root / "tokenpath"
    tree.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    links = {entry.name: entry for entry in (here / "tokenpath").iterdir()}
    links.update({name.rpartition(".")[2]: here / folder
                  for name, folder in NAMESPACE_ROOTS.items() if name != "tokenpath"})
    for name, target in links.items():
        link = tree / name
        if not link.is_symlink():
            link.symlink_to(target)
    return tree


def compiled_core() -> list[Extension]:
    """The mypyc-compiled modules of ``tokenpath/compiled.py`` (docs/performance.md), or
    none where ``TOKENPATH_COMPILE=0`` or mypyc is not installed (plain Python then)."""
    names = runpy.run_path(str(Path(__file__).parent / "tokenpath" / "compiled.py"))
    if os.environ.get(names["COMPILE_ENV"], "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("tokenpath: mypyc is not installed; the compiled core is not built",
              file=sys.stderr)
        return []
    build = Path("build") / "mypyc"
    tree = _installed_layout(build / "src")
    # Options for the compile alone (make lint runs mypy --strict with every dependency
    # installed): a build environment may lack the third-party packages' types.
    config = build / "mypy.ini"
    config.write_text("[mypy]\nignore_missing_imports = True\nfollow_imports = silent\n")
    paths = [str(tree.parent / (name.replace(".", "/") + ".py"))
             for name in names["COMPILED_MODULES"]]
    extensions: list[Extension] = mypycify(
        ["--config-file", str(config), *paths], opt_level="3",
        group_name=names["LIBRARY_GROUP"], target_dir=str(build / "c"))
    for extension in extensions:  # no C compiler: the package installs as plain Python
        extension.optional = True
    return extensions


setup(
    ext_modules=[*NATIVE_EXTENSIONS, *compiled_core()],
    packages=packages,
    package_dir=NAMESPACE_ROOTS,
    package_data=PACKAGE_DATA,
)
