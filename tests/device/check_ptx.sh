#!/bin/bash
# Compiles the device kernels (src/coll/device_kernels.cu: ring Simple and low-latency, direct)
# once with nvcc for sm_90 plus PTX, warnings as errors, and reads what it emitted (the PTX kept
# from that compile): 16-byte global loads and stores, acquire loads and release stores at system
# scope for the FIFO's control words, the low-latency lines as single 8-byte accesses, and no
# local-memory spills in any kernel. Exit 77 (ctest: skipped) where nvcc is absent.
set -euo pipefail
root=$1
out=$2
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
if [[ ! -x $nvcc ]]; then
  echo "nvcc not found at $nvcc: the device build is skipped"
  exit 77
fi
mkdir -p "$out"
flags=(-std=c++20 -O3 -Werror all-warnings -I"$root/include" -I"$root/src" -I"$root"
  -isystem "$(dirname "$nvcc")/../include/cccl")
# One compile (the kernels take minutes): the object for the SASS check, and its PTX kept.
rm -rf "$out/keep"
mkdir -p "$out/keep"
"$nvcc" "${flags[@]}" -gencode arch=compute_90,code=[sm_90,compute_90] -Xptxas -v \
  -keep -keep-dir "$out/keep" \
  -c "$root/src/coll/device_kernels.cu" -o "$out/device_kernels.o" 2> "$out/ptxas.txt"
ptx=$out/keep/device_kernels.ptx
kernels=$(grep -c '^\.visible \.entry' "$ptx")
echo "$kernels kernels in $ptx"
status=0
need() {  # pattern, what it shows
  local found
  found=$(grep -cE "$1" "$ptx" || true)
  if [[ $found -eq 0 ]]; then
    echo "FAIL: no '$1' in the PTX ($2)"
    status=1
  else
    echo "ok: $found x '$1' ($2)"
  fi
}
need 'ld\.global\.v4\.u32' "16-byte global loads"
need 'st\.global\.v4\.u32' "16-byte global stores"
need 'ld\.acquire\.sys' "acquire loads of FIFO words at system scope"
need 'st\.release\.sys' "release stores of FIFO words at system scope"
need 'st\.relaxed\.sys\.b64' "low-latency lines (4 bytes of data and their flag in one 8-byte store), and a Simple slot's bytes in use for a network proxy"
need 'ld\.relaxed\.sys\.b64' "low-latency lines read as one 8-byte load"
need 'bar\.warp\.sync' "the segmented protocol's warp barrier before a lane publishes a segment"
if grep -E 'ld\.(acquire|relaxed)\.(gpu|cta)|st\.(release|relaxed)\.(gpu|cta)' "$ptx" > /dev/null; then
  echo "FAIL: a FIFO word is accessed at a scope narrower than the system"
  status=1
fi
spills=$(grep -E 'bytes spill (stores|loads)' "$out/ptxas.txt" | grep -vc '0 bytes spill stores, 0 bytes spill loads' || true)
functions=$(grep -c 'bytes spill stores' "$out/ptxas.txt" || true)
if [[ $spills -ne 0 ]]; then
  echo "FAIL: $spills of $functions functions spill to local memory:"
  grep -B2 -E '[1-9][0-9]* bytes spill' "$out/ptxas.txt" | head -20
  status=1
else
  echo "ok: none of $functions functions spills (ptxas -v)"
fi
exit $status
