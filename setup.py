"""Maps the top-level folders onto the ``tokenpath.*`` import namespace (SPEC section 3).

``collector/`` installs as ``tokenpath.collector`` and so on, so that a generic top-level
package named ``collector`` or ``agent`` never lands in a user's environment.
"""

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

setup(
    ext_modules=NATIVE_EXTENSIONS,
    packages=packages,
    package_dir=NAMESPACE_ROOTS,
    package_data=PACKAGE_DATA,
)
