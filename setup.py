"""Maps the top-level folders onto the ``tokenpath.*`` import namespace (docs/architecture.md).

``collector/`` installs as ``tokenpath.collector`` and so on, so that a generic top-level
package named ``collector`` or ``agent`` never lands in a user's environment.
"""

import os
import runpy
import sys
import sysconfig
import tempfile
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

# The native OTLP trace decoder (docs/performance.md). Optional: where no C compiler is
# found the build goes on without it and the collector decodes with protobuf's parser,
# the reference it is fuzzed against.
NATIVE_EXTENSIONS = [
    Extension(
        "tokenpath.collector.receivers._otlp_native",
        ["collector/receivers/_otlp_native.c"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
]
# Commands that compile extensions; the others (sdist, egg_info, dist_info) need neither a
# compiler nor mypyc's generated C.
BUILDING_COMMANDS = {"build", "build_ext", "bdist_wheel", "bdist", "install", "develop",
                     "editable_wheel"}


def _builds_extensions() -> bool:
    return any(arg in BUILDING_COMMANDS for arg in sys.argv[1:])


def c_compiler_works() -> bool:
    """Whether the compiler this build would use (``CC`` and Python's build settings)
    compiles a file that includes Python.h. Without one the package installs as plain
    Python: a build that tried anyway would spend a minute generating C it cannot use."""
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "probe.c"
        source.write_text("#include <Python.h>\nint tokenpath_probe(void) { return 0; }\n")
        try:
            compiler.compile([str(source)], output_dir=folder,
                             include_dirs=[sysconfig.get_paths()["include"]])
        except Exception as error:  # CompileError, or no compiler program at all
            print(f"tokenpath: no working C compiler ({error}); building plain Python: "
                  "no compiled core, no native OTLP decoder", file=sys.stderr)
            return False
    return True


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
    # installed). The build environment has the compiled modules' own third-party imports
    # (pyproject.toml's build requirements) but not every package they reach: those are
    # Any, which mypyc compiles as plain objects, correct and slower; but a compiled class
    # on a base it sees as Any is built wrong (it crashed at run time), so that is an error.
    config = build / "mypy.ini"
    config.write_text("[mypy]\nignore_missing_imports = True\nfollow_imports = silent\n"
                      "disallow_subclassing_any = True\n")
    paths = [str(tree.parent / (name.replace(".", "/") + ".py"))
             for name in names["COMPILED_MODULES"]]
    try:
        extensions: list[Extension] = mypycify(
            ["--config-file", str(config), *paths], opt_level="3",
            group_name=names["LIBRARY_GROUP"], target_dir=str(build / "c"))
    except (SystemExit, Exception) as error:  # mypy's errors end in SystemExit
        print(f"tokenpath: mypyc could not compile the core ({error!r}); the package "
              "installs its plain Python (tokenpath --version says core: python)",
              file=sys.stderr)
        return []
    for extension in extensions:  # no C compiler: the package installs as plain Python
        extension.optional = True
    return extensions


# TOKENPATH_COMPILE=0 builds plain Python: no compiled core, no native decoder (an
# editable install for a tool's own venv must not rebuild the checkout's extensions).
ext_modules: list[Extension] = []
if (_builds_extensions() and os.environ.get("TOKENPATH_COMPILE", "1") != "0"
        and c_compiler_works()):
    ext_modules = [*NATIVE_EXTENSIONS, *compiled_core()]

setup(
    ext_modules=ext_modules,
    packages=packages,
    package_dir=NAMESPACE_ROOTS,
    package_data=PACKAGE_DATA,
    exclude_package_data={"": ["*.c"]},  # the decoder's source ships in the sdist only
)
