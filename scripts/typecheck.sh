#!/usr/bin/env bash
# mypy (strict) over the tokenpath.* namespace. The top-level folders map onto
# tokenpath.* only through setup.py's package_dir, which mypy cannot follow, so this
# lays a tree of symlinks with the installed layout and checks that.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
tree=build/typecheck
rm -rf "$tree"
mkdir -p "$tree/tokenpath"
for entry in tokenpath/*; do
  ln -s "../../../$entry" "$tree/tokenpath/"
done
for folder in collector agent instrumentation dashboards; do
  ln -s "../../../$folder" "$tree/tokenpath/$folder"
done
exec "$VENV/bin/mypy" "$tree/tokenpath"
