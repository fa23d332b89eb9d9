#!/usr/bin/env bash
# Builds braid and runs every test. Extra arguments go to ctest (e.g. -L unit, -R Grid).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
