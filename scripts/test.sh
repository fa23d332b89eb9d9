#!/usr/bin/env bash
# Builds braid and runs every test. Extra arguments go to ctest (e.g. -L unit, -R Grid).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python environment first: the NCCL header of its torch's NCCL wheel, where newer than the
# CUDA toolkit's, is the one libnccl.so.2 is built from (shim/CMakeLists.txt).
scripts/python-env.sh > /dev/null
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
