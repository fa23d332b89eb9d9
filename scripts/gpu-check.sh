#!/usr/bin/env bash
# On a machine with a GPU: measures braid's CUDA path and runs its GPU tests, writing what it saw
# under bench/results/gpu-check/ (or $1). Everything it could run takes longer than a lent GPU's
# one call (run 3 took 335 s with a third of today's rows), so the run has a time budget
# (GPU_CHECK_TOTAL_SECONDS) and spends it in this order, each part capped by what is left and the
# parts that no longer fit skipped, saying so, so the summary is always written:
#   1. the machine: nvidia-smi's name, driver and topology beside braid-topo -m (NVML), and the
#      NCCL the machine's torch brings; what each CUDA runtime call of a small collective costs the
#      host, and braid's issue of one (gpu-launch-costs);
#   2. the GPU test programs, to their verdicts, as separate processes sharing the GPU (they
#      assert values, not times): the kernels' grid on device memory, the CUDA communicator tests
#      (1-8 ranks on one GPU, stream order, graph replay, one launch of every rank, windows, work
#      lists), two processes through IPC, DataParallel on device buffers; beside them PyTorch
#      through braid both ways on this machine's torch (scripts/gpu-torch.sh: the braid backend's
#      CUDA tensors and torch's nccl backend over braid's libnccl.so.2; DDP, FSDP2, every dtype;
#      braid_torch built here first), under a budget of their own (GPU_CHECK_TORCH_SECONDS);
#   3. braid-perf all-reduce 8 B - GPU_CHECK_MAX_BYTES (every element checked) at 2 and 8 ranks:
#      ranks as threads, driven by one thread (-g, whose launches hold every rank and so may run
#      the direct engine), and as threads on registered windows (-R 2: the direct engine launched
#      per rank); NCCL itself beside the 2-rank rows (nccl-perf, the machine's torch's NCCL, -g 2);
#   4. a CPU all-reduce at 256 MiB on one CPU channel and on as many as the cores give (issue 37);
#   5. a kernel sweep's first rows, the torch backends' all_reduce time (to set beside braid-perf's
#      rows), then the sweep's rest: braid-perf all-reduce of 2 ranks at one size
#      (GPU_CHECK_SWEEP_BYTES) per engine (direct: one thread drives both ranks; ring: ranks as
#      threads), protocol and channel (block) count, 1 and 16 channels first, so GB/s per block can
#      be read off;
#   6. the test programs on the other engines and protocols (ring, tree, LL tree, segmented; a
#      group's tree all-reduces as work lists) and ranks on two namespace hosts where `ip` exists;
#   7. further braid-perf rows: the segmented protocol forced (2 and 8 ranks to 64 MiB), a group's
#      work list against a launch per call (the ring, and the LL tree at 8 ranks), the device tree
#      (Simple and LL), and 8 ranks with every
#      stream in one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1), with the ranks' rounds and
#      (20 s, expected to stall) without;
#   8. the device form on CPU threads (ctest -L device) where the build tree has it.
# docs/cuda.md says what is and is not covered.
#
# Environment:
#   BRAID_BUILD_DIR       the build tree (default build; built with scripts/build.sh when it lacks
#                         the GPU tests, which a tree carried to a machine without network has)
#   GPU_CHECK_TOTAL_SECONDS the run's budget (default 490: the device call's 520 s limit, less the
#                         archive); the summary's 20 s are kept back from the parts
#   GPU_CHECK_TORCH_SECONDS the torch build's and checks' budget within it (default 150, beside
#                         the first test programs)
#   GPU_CHECK_RANKS       braid-perf's rank counts (default "2 8")
#   GPU_CHECK_TYPES       braid-perf's datatypes (default "float")
#   GPU_CHECK_MAX_BYTES   braid-perf's largest message (default 1G)
#   GPU_CHECK_FACTOR      braid-perf's size step (default 2)
#   GPU_CHECK_SWEEP_BYTES the sweep's message size (default 256M; 0 skips the sweep)
#   GPU_CHECK_SECONDS     the most each test program may run (default 600: test_gpu_comm checks
#                         about 17 000 cases, some of 4M elements, on the host), so a hang costs
#                         minutes
#   GPU_CHECK_PERF_SECONDS the most each braid-perf sweep may run (default GPU_CHECK_SECONDS)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/gpu-check}
build=${BRAID_BUILD_DIR:-build}
limit=${GPU_CHECK_SECONDS:-600}
perf_limit=${GPU_CHECK_PERF_SECONDS:-$limit}
total=${GPU_CHECK_TOTAL_SECONDS:-490}
# When the parts must have ended (scripts/gpu-torch.sh reads it too), the summary's time kept back.
export GPU_CHECK_DEADLINE=$(($(date +%s) + total - 20))
mkdir -p "$out"
if ! nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv \
  > "$out/gpu.csv" 2>&1; then
  echo "gpu-check: nvidia-smi failed (no GPU or no driver here):"
  cat "$out/gpu.csv"
  exit 1
fi
if [[ ! -x $build/tests/test_gpu_kernels ]]; then
  [[ $build == build ]] || { echo "gpu-check: $build has no GPU tests"; exit 1; }
  scripts/build.sh
fi

# run NAME SECONDS command...: output to $out/NAME.txt; one line on stdout: the exit status and
# gtest's counts. Its limit is what is left of the run's budget where that is less (a program
# stopped there is not a failure); where too little is left it is skipped, saying so.
run() {
  local name=$1 seconds=$2 rc=0 capped=0 left
  shift 2
  left=$((GPU_CHECK_DEADLINE - $(date +%s) - 10))  # --kill-after's 10 s
  if ((left < 10)); then
    echo "skipped: the run's ${total} s were spent" > "$out/$name.txt"
    echo "$name: SKIP (the run's ${total} s were spent)"
    return 0
  fi
  ((seconds > left)) && seconds=$left capped=1
  timeout --kill-after=10 "$seconds" "$@" > "$out/$name.txt" 2>&1 || rc=$?
  local verdict="rc=$rc"
  if ((rc == 124 || rc == 137)); then
    verdict="TIMED OUT after ${seconds}s"
    ((capped)) && verdict="stopped after ${seconds}s, at the end of the run's budget"
  fi
  echo "$name: $verdict; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' \
    "$out/$name.txt" | sed "s/, listed below://" | tr '\n' ' ')"
}
# gtest NAME PROGRAM SECONDS [args...]: a GPU test program, its report also as XML.
gtest() {
  run "$1" "$3" "$PWD/$build/tests/$2" "--gtest_output=xml:$out/$1.xml" "${@:4}"
}
# perf NAME [braid-perf args...]: an all-reduce sweep on the GPU, rows also as JSON.
perf() {
  local name=$1
  shift
  run "$name" "$perf_limit" stdbuf -oL "$build/tools/braid-perf" allreduce --device cuda "$@" \
    -T $((perf_limit - 5)) --json "$out/$name.json"
}

# 1. The machine, and where a small call's host time goes (issue 34: 8 us for 8 B at 2 ranks; the
# host took 11 us to issue one in run 3): each CUDA runtime call's cost to the host, and braid's
# own issue of an 8-byte all-reduce of 2 ranks from one thread (bench/gpu_launch_costs.cu).
machine() {
  {
    nvidia-smi topo -m 2>&1 || true
    echo "--- braid-topo -m"
    "$build/tools/braid-topo" -m 2>&1 || true
    echo "--- NCCL of this machine's torch"
    timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "NCCL", torch.cuda.nccl.version())' 2>&1 || true
  } > "$out/topo.txt"
  if [[ -x $build/tools/gpu-launch-costs ]]; then
    run launch-costs 60 "$build/tools/gpu-launch-costs"
  else
    echo "launch-costs: SKIP (no $build/tools/gpu-launch-costs)"
  fi
}

# 2. The test programs' first verdicts, all at once; meanwhile braid_torch is built (CPU only, at
# the lowest priority) and then checked, within the torch budget.
first_tests() {
  gtest kernels test_gpu_kernels "$limit" &
  gtest comm-ranks test_gpu_comm "$limit" --gtest_filter='*CudaCommRanks*' &
  gtest comm-onelaunch test_gpu_comm "$limit" \
    --gtest_filter=CudaComm.OneThreadDrivesEveryRankInOneLaunch &
  gtest comm-windows test_gpu_comm "$limit" \
    --gtest_filter=CudaComm.RanksLaunchedApartReachEachOthersWindows &
  apart='CudaComm.OneThreadDrivesEveryRankInOneLaunch:CudaComm.RanksLaunchedApartReachEachOthersWindows'
  gtest comm-rest test_gpu_comm "$limit" --gtest_filter="CudaComm.*-$apart" &
  gtest ipc test_gpu_ipc "$limit" &
  gtest dp test_gpu_dp "$limit" &
  wait
}
torch_checks() {
  local deadline=$(($(date +%s) + ${GPU_CHECK_TORCH_SECONDS:-150}))
  ((deadline < GPU_CHECK_DEADLINE)) || deadline=$GPU_CHECK_DEADLINE
  nice -n 19 scripts/gpu-torch.sh build "$out"
  GPU_CHECK_DEADLINE=$deadline scripts/gpu-torch.sh checks "$out"
}

# NVIDIA's NCCL beside braid's 2-rank rows (issue 34's bar: braid's time at most NCCL's at every
# size), driven alike (one thread, -g 2, both ranks on this GPU: NCCL 2.30 admits that behind
# NCCL_MULTI_RANK_GPU_ENABLE, which nccl-perf sets): the NCCL of this machine's torch, PyPI's
# nvidia-nccl wheel. SKIP where there is none.
nccl_beside_braid() {
  local name=nccl-allreduce-2ranks-float-group library
  library=$(timeout 60 python3 -c 'import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
print(os.path.join(list(spec.submodule_search_locations)[0], "lib", "libnccl.so.2"))' 2>/dev/null) ||
    true
  if [[ ! -x $build/tools/nccl-perf || ! -f $library ]]; then
    echo "$name: SKIP (nccl-perf: $build/tools/nccl-perf; NCCL: '${library}')" |
      tee "$out/$name.txt"
    return
  fi
  NCCL_PERF_LIBRARY=$library run "$name" "$perf_limit" stdbuf -oL "$build/tools/nccl-perf" \
    allreduce --device cuda -g 2 -b 8 -e "${GPU_CHECK_MAX_BYTES:-1G}" -f "${GPU_CHECK_FACTOR:-2}" \
    -T $((perf_limit - 5)) --json "$out/$name.json"
}

# 3. braid-perf's rows at 2 and 8 ranks, every drive, NCCL beside the 2-rank ones.
perf_rows() {
  for ranks in ${GPU_CHECK_RANKS:-2 8}; do
    for type in ${GPU_CHECK_TYPES:-float}; do
      for drive in group threads windows; do
        case $drive in
          group) flags=(-t 1 -g "$ranks") ;;
          threads) flags=(-t "$ranks") ;;
          windows) flags=(-t "$ranks" -R 2) ;;  # buffers in registered windows: direct per rank
        esac
        perf "perf-allreduce-${ranks}ranks-${type}-${drive}" "${flags[@]}" -b 8 \
          -e "${GPU_CHECK_MAX_BYTES:-1G}" -f "${GPU_CHECK_FACTOR:-2}" -d "$type"
      done
    done
    if [[ $ranks == 2 ]]; then nccl_beside_braid; fi  # a false test must not end the loop's status
  done
}

# 4. CPU channels on this machine's cores (issue 37): a CPU all-reduce of 2 processes at 256 MiB on
# one channel and on as many as the cores give (BRAID_HOST_NCHANNELS=0: at most 4), interleaved,
# each rank free to run on every CPU (--bind none: bound to a core each, a rank gets one channel).
cpu_channels() {
  for round in 1 2 3; do
    for channels in 1 0; do
      BRAID_HOST_NCHANNELS=$channels run "cpu-channels-$channels-round$round" 60 \
        "$build/tools/braid-perf" allreduce --np 2 --bind none -b 256M -e 256M -n 10 -w 3
    done
  done
}

# 6. The sweep at GPU_CHECK_SWEEP_BYTES (0: none): the Simple engines at the channel counts given
# (a block's rate at one channel: issue 34's 20 GB/s), then (`rest`) the other rows.
sweep_bytes=${GPU_CHECK_SWEEP_BYTES:-256M}
sweep() {
  [[ $sweep_bytes != 0 ]] || return 0
  local channels engine
  for channels in "$@"; do
    [[ $channels != rest ]] || { sweep_rest; continue; }
    for engine in direct ring; do
      # One launch holds 32 blocks: 2 ranks x 32 channels would launch apart, as the ring.
      [[ $engine == direct && $channels == 32 ]] && continue
      if [[ $engine == direct ]]; then flags=(-t 1 -g 2); else flags=(-t 2); fi
      BRAID_ALGO=$engine BRAID_PROTO=Simple BRAID_MIN_NCHANNELS=$channels \
        BRAID_MAX_NCHANNELS=$channels perf "sweep-$engine-simple-${channels}ch" "${flags[@]}" \
        -b "$sweep_bytes" -e "$sweep_bytes" -n 10 -w 3
    done
  done
}
sweep_rest() {
  # Ranks as threads on registered windows: the direct engine launched per rank, which no launch
  # limit holds to 32 blocks.
  for channels in 16 32; do
    BRAID_ALGO=direct BRAID_MIN_NCHANNELS=$channels BRAID_MAX_NCHANNELS=$channels \
      perf "sweep-direct-windows-${channels}ch" -t 2 -R 2 -b "$sweep_bytes" -e "$sweep_bytes" \
      -n 10 -w 3
  done
  for channels in 1 4 16; do
    BRAID_ALGO=ring BRAID_PROTO=LL BRAID_MIN_NCHANNELS=$channels BRAID_MAX_NCHANNELS=$channels \
      perf "sweep-ring-ll-${channels}ch" -t 2 -b 1M -e 1M -n 10 -w 3
  done
  # The segmented protocol (not chosen by default until this fits its constants): a block's rate
  # at a mid and a large size.
  for channels in 1 4 16; do
    BRAID_ALGO=ring BRAID_PROTO=segmented BRAID_MIN_NCHANNELS=$channels \
      BRAID_MAX_NCHANNELS=$channels perf "sweep-ring-segmented-${channels}ch" -t 2 -b 1M \
      -e "$sweep_bytes" -f 256 -n 10 -w 3
  done
}

# 6. The test programs on the other engines and protocols, then ranks on two namespace hosts.
more_tests() {
  BRAID_ALGO=ring gtest comm-onelaunch-ring test_gpu_comm "$limit" \
    --gtest_filter=CudaComm.OneThreadDrivesEveryRankInOneLaunch &
  # The device tree on every all-reduce (the other collectives keep the ring).
  BRAID_ALGO=tree gtest comm-onelaunch-tree test_gpu_comm "$limit" \
    --gtest_filter=CudaComm.OneThreadDrivesEveryRankInOneLaunch &
  BRAID_ALGO=tree gtest comm-ranks-tree test_gpu_comm "$limit" --gtest_filter='*CudaCommRanks*' &
  BRAID_ALGO=tree BRAID_PROTO=ll gtest comm-ranks-tree-ll test_gpu_comm "$limit" \
    --gtest_filter='*CudaCommRanks*' &
  # A group's tree all-reduces as work lists (40 small ones: lists of up to 32 calls per rank as
  # threads, 16 or fewer per rank when one thread drives them; Avg's calls alone), ranks as threads
  # and driven from one thread, on Simple slots (named: the model gives small calls LL) and LL.
  local groups='CudaComm.AGroupsCollectivesShareALaunch'
  groups+=':CudaComm.OneThreadDrivesEveryRankThroughAGroupOfCollectives'
  BRAID_ALGO=tree BRAID_PROTO=Simple gtest comm-groups-tree test_gpu_comm "$limit" \
    --gtest_filter="$groups" &
  BRAID_ALGO=tree BRAID_PROTO=ll gtest comm-groups-tree-ll test_gpu_comm "$limit" \
    --gtest_filter="$groups" &
  # The segmented protocol on every ring call.
  BRAID_PROTO=segmented gtest comm-onelaunch-segmented test_gpu_comm "$limit" \
    --gtest_filter=CudaComm.OneThreadDrivesEveryRankInOneLaunch &
  BRAID_PROTO=segmented gtest comm-ranks-segmented test_gpu_comm "$limit" \
    --gtest_filter='*CudaCommRanks*' &
  wait
  run hosts "$limit" tests/multihost/netns_hosts.sh --hosts 2 -- "$PWD/$build/tests/test_gpu_hosts"
}

# 7. Further braid-perf rows.
more_perf_rows() {
  # A group of 8 all-reduces per rank (-m 8) in one work-list launch against a launch each
  # (BRAID_DEVICE_LAUNCH_WORKS=1), 2 ranks as threads, 8 B - 64 KiB, interleaved twice: the time
  # a group's lists save (docs/core.md).
  for round in 1 2; do
    for works in 32 1; do
      BRAID_DEVICE_LAUNCH_WORKS=$works perf \
        "perf-allreduce-2ranks-float-threads-m8-works$works-round$round" -t 2 -m 8 -b 8 -e 64K -f 4
    done
  done
  # The same on the LL tree, 8 ranks as threads, once: what a tree's lists save.
  for works in 32 1; do
    BRAID_ALGO=tree BRAID_PROTO=ll BRAID_DEVICE_LAUNCH_WORKS=$works perf \
      "perf-allreduce-8ranks-float-threads-tree-ll-m8-works$works" -t 8 -m 8 -b 8 -e 64K -f 4
  done
  # The segmented protocol beside the chosen ones (Simple and LL): 2 and 8 ranks as threads.
  for ranks in 2 8; do
    BRAID_PROTO=segmented perf "perf-allreduce-${ranks}ranks-float-threads-segmented" \
      -t "$ranks" -b 8 -e 64M -f 4
  done
  # The device tree's all-reduce beside the chosen algorithms: 8 ranks as threads, to 4 MiB, and
  # on LL's flagged lines, to 256 KiB.
  BRAID_ALGO=tree perf perf-allreduce-8ranks-float-threads-tree -t 8 -b 8 -e 4M -f 4
  BRAID_ALGO=tree BRAID_PROTO=ll perf perf-allreduce-8ranks-float-threads-tree-ll -t 8 -b 8 \
    -e 256K -f 4
  # Every stream in one hardware queue, 8 ranks as threads, calls back to back: the hazard that
  # likely stalled run 3 (docs/cuda.md) laid bare; the ranks' rounds must carry it through.
  CUDA_DEVICE_MAX_CONNECTIONS=1 perf perf-allreduce-8ranks-float-threads-1queue -t 8 -b 8 -e 1M \
    -f 4
  # The control, for 20 s at most: the same without rounds (BRAID_LAUNCH_ROUNDS=0). A stall here
  # and none above says the shared queue was the cause and the rounds its fix.
  BRAID_LAUNCH_ROUNDS=0 CUDA_DEVICE_MAX_CONNECTIONS=1 \
    run perf-allreduce-8ranks-float-threads-1queue-norounds 20 "$build/tools/braid-perf" \
    allreduce --device cuda -t 8 -b 8 -e 64K -f 4 -T 15
}

machine | tee "$out/launch.txt"
torch_checks > "$out/torch-phase.txt" 2>&1 &
torch=$!
first_tests | tee "$out/tests.txt"
wait "$torch" || true
perf_rows | tee "$out/perf.txt"
cpu_channels | tee "$out/cpu-channels.txt"
sweep 1 16 | tee "$out/sweep.txt"
scripts/gpu-torch.sh timing "$out" > /dev/null
sweep 2 4 8 32 rest | tee -a "$out/sweep.txt"
more_tests | tee -a "$out/tests.txt"
more_perf_rows | tee -a "$out/perf.txt"

# 8. The device form on CPU threads, where the tree has it (and time is left).
if [[ -x $build/tests/test_device_form ]] && (($(date +%s) + 60 < GPU_CHECK_DEADLINE)); then
  (cd "$build" && timeout $((GPU_CHECK_DEADLINE - $(date +%s))) ctest -L device -j"$(nproc)") 2>&1 |
    tail -5 | tee "$out/ctest-device.txt" || true
else
  echo "device form (ctest -L device) not run here (not built in $build, or no time left):" \
    "it runs in CI on CPUs" | tee "$out/ctest-device.txt"
fi

{
  echo "gpu-check at $(git rev-parse --short HEAD 2> /dev/null || echo unknown) on $(date -u +%F)"
  cat "$out/gpu.csv"
  tail -1 "$out/topo.txt"
  cat "$out/tests.txt" "$out/ctest-device.txt" "$out/launch.txt"
  cat "$out/launch-costs.txt" 2> /dev/null || true
  cat "$out/torch.txt" 2> /dev/null || echo "torch: no result (torch-*.txt)"
  grep -H -E "Out of bounds|Avg bus bandwidth" "$out"/sweep-*.txt "$out"/perf-*.txt \
    "$out"/nccl-*.txt "$out"/cpu-channels-*.txt 2> /dev/null || true
} > "$out/summary.txt"
cat "$out/summary.txt"
# Failed: a program that did not exit 0 (77 is netns_hosts.sh's skip: no namespaces there; the
# control without rounds may stall); a part stopped or skipped for the budget is not a failure.
failed=$(grep -h -E "rc=[1-9]|TIMED OUT" "$out/tests.txt" "$out/sweep.txt" "$out/perf.txt" \
  "$out/cpu-channels.txt" "$out/launch.txt" |
  grep -v -e "rc=77;" -e "-norounds:" || true)
[[ -z $failed ]] && ! grep -q "tests failed" "$out/ctest-device.txt"
