#!/usr/bin/env bash
# Shows that the device form's tests can see the mistakes the engine's ordering guards
# against: each mutation below is applied to a scratch copy of the sources, test_device_form is
# built with ThreadSanitizer from it, and one grid shape is run; the script fails unless every
# mutant fails (TSan report or wrong result) and the unmutated copy passes.
#   no-barrier:   the group's vote before a post is dropped (coll/ring_engine.h), so the leader
#                 publishes a slot while other threads of its block may still write it;
#   relaxed-post: the FIFO's release store becomes relaxed (transport/fifo_view.h), so a receiver
#                 may read the slot before the sender's bytes;
#   no-resume:    the views no longer take up the FIFO's counters (coll/ring_engine.h), so a call
#                 after the first on the same FIFOs starts from zero (what a communicator's second
#                 call, or a graph's replay, would do).
#   no-warp-barrier: the segmented protocol's warp barrier before a segment's flag is dropped
#                 (coll/ring_engine.h), so the first lane publishes a segment while the warp's other
#                 lanes may still write it.
# Usage: [MUTANTS="no-barrier ..."] mutation_check.sh [gtest filter] (default: every mutant, on
# one 4-rank, 4-thread shape of every algorithm)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
filter="${1:-*4ranks_1ch_4threads_2slots*}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cccl=/usr/local/cuda/include/cccl
[[ -d "$cccl" ]] && cccl_flag=(-isystem "$cccl") || cccl_flag=()

build_and_run() {  # name, then sed expressions applied to file
  local name="$1" file="$2" expr="$3" dir="$scratch/$1"
  mkdir -p "$dir"
  cp -r "$repo/src" "$repo/base" "$repo/include" "$repo/transport" "$repo/tests" "$dir/"
  if [[ -n "$file" ]]; then
    cp "$dir/$file" "$dir/$file.orig"
    sed -i "$expr" "$dir/$file"
    if cmp -s "$dir/$file" "$dir/$file.orig"; then echo "$name: the mutation did not apply"; exit 2; fi
  fi
  g++ -std=c++20 -O2 -g -fsanitize=thread "${cccl_flag[@]}" -I"$dir/include" -I"$dir/src" -I"$dir" \
    -I"$dir/tests" "$dir/tests/device/test_device_form.cc" -o "$dir/test" -lgtest -lgtest_main -pthread
  TSAN_OPTIONS="halt_on_error=1" timeout 900 "$dir/test" --gtest_filter="$filter" >"$dir/log" 2>&1
}

status=0
if build_and_run original "" ""; then echo "original: passes"; else
  echo "original: FAILS (see below)"; tail -20 "$scratch/original/log"; exit 1; fi
for mutant in ${MUTANTS:-no-barrier relaxed-post no-resume no-warp-barrier}; do
  case "$mutant" in
    no-barrier) file=src/coll/ring_engine.h expr='s/if (group.any(!ready)) return false;/if (!ready) return false;/' ;;
    relaxed-post) file=transport/fifo_view.h expr='/storeRelease/,/^}/s/memory_order_release/memory_order_relaxed/' ;;
    no-resume) file=src/coll/ring_engine.h expr='s/^  ports.resume(group);$//' ;;
    no-warp-barrier) file=src/coll/ring_engine.h expr='s/^        group.syncWarp();  .*$//' ;;
  esac
  if build_and_run "$mutant" "$file" "$expr"; then
    echo "$mutant: NOT caught (the tests passed)"; status=1
  else
    echo "$mutant: caught: $(grep -m1 -E 'WARNING: ThreadSanitizer|Failure|wrong' "$scratch/$mutant/log" || tail -1 "$scratch/$mutant/log")"
    grep -m3 -E '^    #[0-9] .*(combine|runPrim|load16|store16|memcpy)' "$scratch/$mutant/log" || true
  fi
done
exit $status
