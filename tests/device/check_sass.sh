#!/bin/bash
# The device kernels as the GPU runs them: `cuobjdump -sass` of the object device_ptx compiled
# (in $2; tools from PyPI, scripts/sass-tools.sh, into $3), read by sass_loads.py. Every Simple
# and segmented ring kernel and every direct kernel must issue at least MIN_LOADS 16-byte global
# loads before it uses the first (the design: kPacksInFlight = 4 packs of each of the two sources a
# move reduces, so one round trip to memory brings 8 packs; docs/cuda.md), touch no local memory,
# and keep to the
# registers a block of kMaxThreadsPerBlock threads allows (65536 / 512 = 128).
# Exit 77 (ctest: skipped) where device_ptx could not compile (no nvcc).
set -euo pipefail
root=$1
out=$2
tools=$3
min_loads=8
if [[ ! -f $out/device_kernels.o ]]; then
  echo "no $out/device_kernels.o (device_ptx makes it where nvcc is): skipped"
  exit 77
fi
bin=$("$root/scripts/sass-tools.sh" "$tools")
PATH=$bin:$PATH "$bin/cuobjdump" -sass "$out/device_kernels.o" > "$out/device_kernels.sass"
threads=$(sed -n 's/^constexpr int kMaxThreadsPerBlock = \([0-9]*\);.*/\1/p' \
  "$root/src/coll/device_kernels.cuh")
exec python3 "$root/tests/device/sass_loads.py" --sass "$out/device_kernels.sass" \
  --ptxas "$out/ptxas.txt" --min-loads "$min_loads" --max-registers $((65536 / threads))
