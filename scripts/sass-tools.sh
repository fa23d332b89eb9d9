#!/usr/bin/env bash
# cuobjdump and nvdisasm, which the CUDA toolkit at /usr/local/cuda lacks, from PyPI into a small
# virtual environment under the build tree (build/sass-tools, or $1), at pinned versions; nothing
# where they are there already. Prints the folder that holds them.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/sass-tools}
version=13.5.37
bin=$venv/lib/python3*/site-packages/nvidia/cu13/bin
# shellcheck disable=SC2086
if ! ls $bin/cuobjdump $bin/nvdisasm > /dev/null 2>&1; then
  echo "sass-tools: installing cuobjdump and nvdisasm $version into $venv" >&2
  "${PYTHON:-python3}" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet "nvidia-cuda-cuobjdump==$version" \
    "nvidia-cuda-nvdisasm==$version" >&2
fi
# shellcheck disable=SC2086
cd $bin && pwd
