#!/usr/bin/env bash
# braid's torch.distributed backend, tested: the Python environment (scripts/python-env.sh: torch
# from PyPI into $BRAID_VENV, default build/venv), the package (python/) built against this
# build's libbraid ($BRAID_LIB_DIR, default build/src), and pytest over tests/python (from the
# repository root, so the installed package is the one imported). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/python-env.sh "${BRAID_VENV:-build/venv}")
"$python" -m pip install --no-build-isolation --quiet ./python
exec "$(dirname "$python")/pytest" -q tests/python "$@"
