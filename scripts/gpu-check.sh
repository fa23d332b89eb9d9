#!/usr/bin/env bash
# On a machine with a GPU: builds braid with CUDA (unless build/ already holds the GPU tests, as
# when the build tree is carried to a machine without network), runs the device tests and writes
# what it saw under bench/results/gpu-check/ (or $1): the GPU's name and driver from nvidia-smi,
# the GPU tests (ctest -L gpu: the kernels' grid on device memory, CUDA communicators with 1-8
# ranks on one GPU, stream order, graph replay, two processes through IPC), the device form and
# PTX checks (ctest -L device), and braid-perf --device cuda (2, 4, 8 ranks as threads, 8 B to
# 1 GiB, fp32 and bf16, every element checked; then the same ranks driven by one thread, -g, whose
# launches hold every rank and so may run the direct engine). docs/cuda.md says what is and is not
# covered.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/gpu-check}
mkdir -p "$out"
if ! nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv \
  > "$out/gpu.csv" 2>&1; then
  echo "gpu-check: nvidia-smi failed (no GPU or no driver here):"
  cat "$out/gpu.csv"
  exit 1
fi
nvidia-smi topo -m > "$out/topo.txt" 2>&1 || true
if [[ ! -x build/tests/test_gpu_kernels ]]; then
  scripts/build.sh
fi
status=0
(cd build && ctest -L gpu --output-on-failure --timeout 900) 2>&1 | tee "$out/ctest-gpu.txt" ||
  status=1
(cd build && ctest -L device -j"$(nproc)" --timeout 900) 2>&1 | tail -5 \
  | tee "$out/ctest-device.txt" || status=1
for ranks in 2 4 8; do
  for type in float bfloat16; do
    for drive in threads group; do
      if [[ $drive == threads ]]; then flags=(-t "$ranks"); else flags=(-t 1 -g "$ranks"); fi
      name="perf-allreduce-${ranks}ranks-${type}-${drive}"
      build/tools/braid-perf allreduce --device cuda "${flags[@]}" -b 8 -e 1G -f 2 -d "$type" \
        --json "$out/$name.json" > "$out/$name.txt" 2>&1 || status=1
    done
  done
done
{
  echo "gpu-check at $(git rev-parse --short HEAD) on $(date -u +%F)"
  cat "$out/gpu.csv"
  grep -E "tests passed|tests failed|Skipped|Failed" "$out/ctest-gpu.txt" || true
  grep -H -E "Out of bounds|Avg bus bandwidth" "$out"/perf-*.txt || true
} > "$out/summary.txt"
cat "$out/summary.txt"
exit $status
