#!/usr/bin/env bash
# Builds bench/allreduce_vs_mpi (if needed) and runs it on 2 ranks under mpirun.
# Usage: bench/run-vs-mpi.sh [--save] [--build-dir DIR] [-np N] [benchmark options: -b -e -f -n -r --json FILE]
#   --save  also write the output to bench/results/allreduce_vs_mpi.txt
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
build="$repo/build-bench"
save=0
ranks=2
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --save) save=1 ;;
    --build-dir) build="$2"; shift ;;
    -np) ranks="$2"; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done

if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
ninja -C "$build" allreduce_vs_mpi >/dev/null

launcher=(mpirun --oversubscribe -np "$ranks")
[[ "$(id -u)" == 0 ]] && launcher+=(--allow-run-as-root)
command=("${launcher[@]}" "$build/bench/allreduce_vs_mpi" "${args[@]}")

if [[ $save == 1 ]]; then
  mkdir -p "$repo/bench/results"
  "${command[@]}" | tee "$repo/bench/results/allreduce_vs_mpi.txt"
else
  "${command[@]}"
fi
