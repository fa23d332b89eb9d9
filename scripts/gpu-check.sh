#!/usr/bin/env bash
# On a machine with a GPU: runs braid's GPU tests and braid-perf --device cuda, and writes what it
# saw under bench/results/gpu-check/ (or $1): the GPU's name and driver (nvidia-smi), each GPU test
# program once (the kernels' grid on device memory; CUDA communicators with 1-8 ranks on one GPU,
# stream order, graph replay, one launch of every rank on the direct engine and, with
# BRAID_ALGO=ring, on the ring; two processes through IPC; DataParallel on device buffers; ranks on
# two namespace hosts), the device form on CPU threads (ctest -L device) where it is built, and
# braid-perf all-reduce (every element checked) with ranks as threads and driven by one thread (-g,
# whose launches hold every rank and so may run the direct engine). docs/cuda.md says what is and is
# not covered.
#
# Environment:
#   BRAID_BUILD_DIR      the build tree (default build; built with scripts/build.sh when it lacks
#                        the GPU tests, which a tree carried to a machine without network has)
#   GPU_CHECK_RANKS      braid-perf's rank counts (default "2 4 8")
#   GPU_CHECK_TYPES      braid-perf's datatypes (default "float bfloat16")
#   GPU_CHECK_MAX_BYTES  braid-perf's largest message (default 1G)
#   GPU_CHECK_SECONDS    the most each program may run (default 600: test_gpu_comm checks 17 706
#                        cases, some of 4M elements, on the host), so a hang costs minutes
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/gpu-check}
build=${BRAID_BUILD_DIR:-build}
limit=${GPU_CHECK_SECONDS:-600}
mkdir -p "$out"
if ! nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv \
  > "$out/gpu.csv" 2>&1; then
  echo "gpu-check: nvidia-smi failed (no GPU or no driver here):"
  cat "$out/gpu.csv"
  exit 1
fi
nvidia-smi topo -m > "$out/topo.txt" 2>&1 || true
if [[ ! -x $build/tests/test_gpu_kernels ]]; then
  [[ $build == build ]] || { echo "gpu-check: $build has no GPU tests"; exit 1; }
  scripts/build.sh
fi

# run NAME SECONDS command...: output to $out/NAME.txt; one line on stdout: the exit status and
# gtest's counts.
run() {
  local name=$1 seconds=$2 rc=0
  shift 2
  timeout --kill-after=10 "$seconds" "$@" > "$out/$name.txt" 2>&1 || rc=$?
  local verdict="rc=$rc"
  ((rc == 124 || rc == 137)) && verdict="TIMED OUT after ${seconds}s"
  echo "$name: $verdict; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' \
    "$out/$name.txt" | sed "s/, listed below://" | tr '\n' ' ')"
}
# gtest NAME PROGRAM SECONDS [args...]: a GPU test program, its report also as XML.
gtest() {
  run "$1" "$3" "$PWD/$build/tests/$2" "--gtest_output=xml:$out/$1.xml" "${@:4}"
}

{
  gtest kernels test_gpu_kernels "$limit"
  gtest comm test_gpu_comm "$limit"
  BRAID_ALGO=ring gtest comm-ring test_gpu_comm "$limit" \
    --gtest_filter=CudaComm.OneThreadDrivesEveryRankInOneLaunch
  gtest ipc test_gpu_ipc "$limit"
  gtest dp test_gpu_dp "$limit"
  run hosts "$limit" tests/multihost/netns_hosts.sh --hosts 2 -- "$PWD/$build/tests/test_gpu_hosts"
} | tee "$out/tests.txt"

if [[ -x $build/tests/test_device_form ]]; then
  (cd "$build" && ctest -L device -j"$(nproc)" --timeout 900) 2>&1 | tail -5 \
    | tee "$out/ctest-device.txt"
else
  echo "device form (ctest -L device) not built in $build: it runs in CI on CPUs" \
    | tee "$out/ctest-device.txt"
fi

for ranks in ${GPU_CHECK_RANKS:-2 4 8}; do
  for type in ${GPU_CHECK_TYPES:-float bfloat16}; do
    for drive in threads group; do
      if [[ $drive == threads ]]; then flags=(-t "$ranks"); else flags=(-t 1 -g "$ranks"); fi
      name="perf-allreduce-${ranks}ranks-${type}-${drive}"
      run "$name" "$limit" stdbuf -oL "$build/tools/braid-perf" allreduce --device cuda "${flags[@]}" -b 8 \
        -e "${GPU_CHECK_MAX_BYTES:-1G}" -f 2 -d "$type" -T $((limit - 5)) --json "$out/$name.json"
    done
  done
done | tee "$out/perf.txt"
{
  echo "gpu-check at $(git rev-parse --short HEAD 2> /dev/null || echo unknown) on $(date -u +%F)"
  cat "$out/gpu.csv"
  cat "$out/tests.txt" "$out/ctest-device.txt"
  grep -H -E "Out of bounds|Avg bus bandwidth" "$out"/perf-*.txt || true
} > "$out/summary.txt"
cat "$out/summary.txt"
# Failed: a program that did not exit 0 (77 is netns_hosts.sh's skip: no namespaces there).
failed=$(grep -h -E "rc=[1-9]|TIMED OUT" "$out/tests.txt" "$out/perf.txt" | grep -v "rc=77;" || true)
[[ -z $failed ]] && ! grep -q "tests failed" "$out/ctest-device.txt"
