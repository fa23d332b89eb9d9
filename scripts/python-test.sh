#!/usr/bin/env bash
# braid's torch.distributed backend, tested: the Python environment (scripts/python-env.sh: torch
# from PyPI into $BRAID_VENV, default build/venv), the package (python/) built against this
# build's libbraid ($BRAID_LIB_DIR, default build/src), and pytest (from the repository root, so
# the installed package is the one imported) over its arguments, by default tests/python (braid's
# own tests; PyTorch's suite is tests/python/torch_suite.py, its passing cases
# @tests/python/torch_suite_passing.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/python-env.sh "${BRAID_VENV:-build/venv}")
"$python" -m pip install --no-build-isolation --quiet ./python
if [[ $# -eq 0 ]]; then set -- tests/python; fi
exec "$(dirname "$python")/pytest" -q -p no:cacheprovider "$@"
