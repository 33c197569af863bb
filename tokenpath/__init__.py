"""tokenpath."""

from tokenpath.compiled import install_pure_python_finder, pure_python_requested

if pure_python_requested():  # TOKENPATH_PURE_PYTHON=1: see tokenpath/compiled.py
    install_pure_python_finder()
