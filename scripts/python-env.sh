#!/usr/bin/env bash
# The Python environment of braid's PyTorch backend: a virtual environment under the build tree
# (build/venv, or $1) with the newest torch PyPI serves, pytest, numpy and matplotlib (the
# benchmark's plot). Does nothing where it is complete already. Prints the environment's python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/venv}
python=${PYTHON:-python3}
if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c "import torch, pytest, numpy, matplotlib" 2>/dev/null; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet torch pytest numpy matplotlib >&2
fi
echo "$(cd "$venv" && pwd)/bin/python"
