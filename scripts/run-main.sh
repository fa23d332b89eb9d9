#!/usr/bin/env bash
# The main job: builds braid, then runs a 2-process all-reduce from 8 B to 256 MiB with every
# element checked, printed as an nccl-tests table.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec build/tools/braid-perf allreduce -b 8 -e 256M -f 4 --np 2 -c 1 "$@"
