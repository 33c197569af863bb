"""tokenpath."""

from tokenpath.install_check import install_import_hook

# Decides, before the first compiled module is imported, whether this process runs the
# compiled core or its plain Python source (tokenpath/install_check.py).
install_import_hook()
