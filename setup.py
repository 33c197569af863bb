"""Maps the top-level folders onto the ``tokenpath.*`` import namespace (SPEC section 3).

``collector/`` installs as ``tokenpath.collector`` and so on, so that a generic top-level
package named ``collector`` or ``agent`` never lands in a user's environment.
"""

from setuptools import find_packages, setup

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

setup(
    packages=packages,
    package_dir=NAMESPACE_ROOTS,
    package_data=PACKAGE_DATA,
)
