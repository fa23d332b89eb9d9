#!/usr/bin/env bash
# The Python environment of braid's PyTorch backend: a virtual environment under the build tree
# (build/venv, or $1) with the packages of python/constraints.txt, at the versions it pins (torch,
# the NCCL it brings, pytest, numpy, matplotlib for the benchmark's plot, expecttest for PyTorch's
# own tests). Does nothing where they are all there already. Prints the environment's python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/venv}
python=${PYTHON:-python3}
constraints=$PWD/python/constraints.txt
if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv" >&2
fi
# Every pinned package installed at its version?
pinned() {
  "$venv/bin/python" - "$constraints" <<'PY'
import importlib.metadata as metadata, sys
for line in open(sys.argv[1]):
    spec = line.split("#")[0].strip()
    if spec:
        name, version = spec.split("==")
        try:
            if metadata.version(name) != version:
                sys.exit(1)
        except metadata.PackageNotFoundError:
            sys.exit(1)
PY
}
if ! pinned; then
  echo "python-env: installing $(grep -E '^torch==' "$constraints") and the test packages" \
    "into $venv (a download of about 5 GB: minutes)" >&2
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  packages=$(sed -e 's/#.*//' -e 's/==.*//' "$constraints" | grep -v '^ *$' | tr '\n' ' ')
  # pip's own progress (a line per download where the output is not a terminal).
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install --progress-bar on -c "$constraints" $packages >&2
fi
echo "$(cd "$venv" && pwd)/bin/python"
