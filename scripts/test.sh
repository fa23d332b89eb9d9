#!/usr/bin/env bash
# Builds braid and runs every test. Extra arguments go to ctest (e.g. -L unit, -R Grid).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python environment first: the NCCL header of its torch's NCCL wheel, where newer than the
# CUDA toolkit's, is the one libnccl.so.2 is built from (shim/CMakeLists.txt). Without it (no
# network, say) the build goes on with the toolkit's header, and the Python tests say why they fail.
scripts/python-env.sh > /dev/null ||
  echo "test: no Python environment (scripts/python-env.sh failed); libnccl.so.2 is built from the CUDA toolkit's nccl.h" >&2
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
