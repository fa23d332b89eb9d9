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
# And the tree engine's, on test_tree_form (6 ranks, 5 back to back, 7 as trees of hosts of 3, 3
# running work lists in each protocol):
#   tree-no-barrier: the tree steps' votes before a post are dropped (coll/tree_engine.h);
#   tree-no-resume:  a rank's port to its parent no longer takes up the FIFO's counters;
#   tree-list-restart: each call of a work list starts from the counters the list started from
#                 (its ports copied afresh), not where the call before it left them;
#   tree-root-chain: a rooted tree's root no longer starts its host's chain (base/binary_trees.h,
#                 TreesOfHosts), so the root is not the top of its trees.
# Usage: [MUTANTS="no-barrier ..."] mutation_check.sh [gtest filter] (default: every mutant, on
# one 4-rank, 4-thread shape of every algorithm of the Grid suite; the filter is the ring's. The
# work lists' suite, Lists/, is left out by default: a mutant that desynchronizes its counters
# waits out the 60 s deadline of each of its 12 lists)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
filter="${1:-Grid/*4ranks_1ch_4threads_2slots*}"
tree_filter='*/6ranks_4threads_2slots:*/backtoback_5ranks_2threads_1slots:*/7ranks_3perhost_2threads_2slots:*/lists_3ranks_4threads_2slots:*/ll_lists_3ranks_4threads_2slots'
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cccl=/usr/local/cuda/include/cccl
[[ -d "$cccl" ]] && cccl_flag=(-isystem "$cccl") || cccl_flag=()

build_and_run() {  # name, file, sed expressions applied to it, test source, gtest filter
  local name="$1" file="$2" expr="$3" test="$4" filter="$5" dir="$scratch/$1"
  mkdir -p "$dir"
  cp -r "$repo/src" "$repo/base" "$repo/include" "$repo/transport" "$repo/tests" "$dir/"
  if [[ -n "$file" ]]; then
    cp "$dir/$file" "$dir/$file.orig"
    sed -i "$expr" "$dir/$file"
    if cmp -s "$dir/$file" "$dir/$file.orig"; then echo "$name: the mutation did not apply"; exit 2; fi
  fi
  g++ -std=c++20 -O2 -g -fsanitize=thread "${cccl_flag[@]}" -I"$dir/include" -I"$dir/src" -I"$dir" \
    -I"$dir/tests" "$dir/tests/device/$test" -o "$dir/test" -lgtest -lgtest_main -pthread
  TSAN_OPTIONS="halt_on_error=1" timeout 900 "$dir/test" --gtest_filter="$filter" >"$dir/log" 2>&1
}

status=0
for original in test_device_form.cc test_tree_form.cc; do
  [[ $original == test_tree_form.cc ]] && of="$tree_filter" || of="$filter"
  if build_and_run "original-${original%.cc}" "" "" "$original" "$of"; then
    echo "original $original: passes"
  else
    echo "original $original: FAILS (see below)"; tail -20 "$scratch/original-${original%.cc}/log"; exit 1
  fi
done
for mutant in ${MUTANTS:-no-barrier relaxed-post no-resume no-warp-barrier tree-no-barrier \
  tree-no-resume tree-list-restart tree-root-chain}; do
  test=test_device_form.cc mf="$filter"
  case "$mutant" in
    no-barrier) file=src/coll/ring_engine.h expr='s/if (group.any(!ready)) return false;/if (!ready) return false;/' ;;
    relaxed-post) file=transport/fifo_view.h expr='/storeRelease/,/^}/s/memory_order_release/memory_order_relaxed/' ;;
    no-resume) file=src/coll/ring_engine.h expr='s/^  ports.resume(group);$//' ;;
    no-warp-barrier) file=src/coll/ring_engine.h expr='s/^        group.syncWarp();  .*$//' ;;
    tree-no-barrier) file=src/coll/tree_engine.h expr='s/if (group.any(!ready)) return false;/if (!ready) return false;/' ;;
    tree-no-resume) file=src/coll/tree_engine.h expr='s/^  if (place.hasParent) ports.parent.resume(group);$//' ;;
    tree-list-restart) file=src/coll/tree_engine.h expr='s/if (!runTree(group, move, call, ports)) return false;/if (TreePorts<Ports> fresh = ports; !runTree(group, move, call, fresh)) return false;/' ;;
    tree-root-chain) file=base/binary_trees.h expr='s/^      while (chain.front() != root) {$/      while (false) {/' ;;
  esac
  [[ $mutant == tree-* ]] && test=test_tree_form.cc mf="$tree_filter"
  if build_and_run "$mutant" "$file" "$expr" "$test" "$mf"; then
    echo "$mutant: NOT caught (the tests passed)"; status=1
  else
    echo "$mutant: caught: $(grep -m1 -E 'WARNING: ThreadSanitizer|Failure|wrong' "$scratch/$mutant/log" || tail -1 "$scratch/$mutant/log")"
    grep -m3 -E '^    #[0-9] .*(combine|runPrim|load16|store16|memcpy)' "$scratch/$mutant/log" || true
  fi
done
exit $status
