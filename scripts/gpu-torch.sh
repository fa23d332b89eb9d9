#!/usr/bin/env bash
# PyTorch on the lent GPU through braid (issue 35's GPU acceptance), called by gpu-check.sh with
# the machine's own torch (`python3`; nothing can be installed there):
#
#   scripts/gpu-torch.sh build OUT    braid_torch into OUT/torch-site: the bundle's, prebuilt for
#                                     that torch and Python, where it imports there with CUDA; else
#                                     built there against that torch (its log torch-build.txt)
#   scripts/gpu-torch.sh checks OUT   DDP (2 and 4 ranks, 50 steps) and all_reduce of every dtype
#                                     and op through the braid backend's CUDA tensors and through
#                                     torch's nccl backend over braid's libnccl.so.2 (LD_PRELOAD);
#                                     a barrier behind async all_reduces (they have ended when it
#                                     returns); a send in flight while the first collective makes
#                                     the CUDA communicator; FSDP2, a CUDA graph's replays and torchrun
#                                     --nproc-per-node 4 through both; every rank on cuda:0
#   scripts/gpu-torch.sh timing OUT   all_reduce 8 B - 256 MiB through both, 2 ranks
#
# Each check is one line of OUT/torch.txt (PASS/FAIL/SKIP first) and its output in
# OUT/torch-*.txt; nothing here fails the run (fail soft). BRAID_BUILD_DIR: the carried build
# (build-carry). GPU_CHECK_DEADLINE (seconds since the epoch, from gpu-check.sh): no check runs
# past it, and one that would start with too little time left is skipped, saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
phase=$1
mkdir -p "$2"
out=$(cd "$2" && pwd)  # absolute: the build runs in a copy of the sources elsewhere
root=$PWD
build=${BRAID_BUILD_DIR:-build}
shim=$root/$build/shim/libnccl.so.2
site=$out/torch-site

# one NAME SECONDS BACKEND RANKS CHECK [torchrun]: tests/gpu/torch_gpu.py once, under a limit,
# its ranks spawned by the script or launched by torchrun.
one() {
  local name=$1 seconds=$2 backend=$3 ranks=$4 check=$5 preload=() launch=(python3) left
  local capped=0
  if [[ -n ${GPU_CHECK_DEADLINE:-} ]]; then
    left=$((GPU_CHECK_DEADLINE - $(date +%s) - 10))
    if ((left < 20)); then
      echo "SKIP $name: the run's time was spent" | tee -a "$out/torch.txt"
      return
    fi
    ((seconds > left)) && seconds=$left capped=1
  fi
  [[ $backend == nccl ]] && preload=(env "LD_PRELOAD=$shim")
  [[ ${6:-} == torchrun ]] && launch=(python3 -m torch.distributed.run --nproc-per-node "$ranks")
  if [[ $backend == braid && ! -d $site/braid_torch ]]; then
    echo "SKIP $name: braid_torch was not built here (torch-build.txt)" | tee -a "$out/torch.txt"
    return
  fi
  PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} TORCH_GPU_REFERENCES=$out \
    timeout --kill-after=10 "$seconds" "${preload[@]}" "${launch[@]}" tests/gpu/torch_gpu.py \
    "$backend" "$ranks" "$check" "$out/torch-$name.json" > "$out/torch-$name.txt" 2>&1
  local rc=$?
  {
    grep -E '^(PASS|FAIL)' "$out/torch-$name.txt" ||
      if ((capped && (rc == 124 || rc == 137))); then
        echo "STOPPED $name: after ${seconds}s, at the end of the run's budget (torch-$name.txt)"
      else
        echo "FAIL $name: rc=$rc, no verdict (torch-$name.txt)"
      fi
  } | tee -a "$out/torch.txt"
}

# Whether the braid_torch in $site imports here, built with CUDA (a build that found no CUDA
# runtime is CPU-only, and every braid check would fail for it).
works() {
  PYTHONPATH=$site python3 -c 'import braid_torch, sys; sys.exit(0 if braid_torch.HAS_CUDA else 1)'
}

# braid_torch built here against this torch, within 300 s.
build_here() {
  rm -rf "$site" /tmp/braid-torch-src
  # A copy: the build writes beside the sources (python/build), which may not be writable.
  cp -r python /tmp/braid-torch-src
  # setup.py's build_ext alone: no pip or wheel package needed there.
  (cd /tmp/braid-torch-src && BRAID_LIB_DIR=$root/$build/lib BRAID_INCLUDE_DIR=$root/include \
    MAX_JOBS=8 timeout 300 python3 setup.py build_ext --build-lib "$site") &&
    cp /tmp/braid-torch-src/braid_torch/__init__.py "$site/braid_torch/"
}

# The bundle's braid_torch, prebuilt for this torch and Python (scripts/prebuild-braid-torch.sh),
# if it has one.
use_prebuilt() {
  local version suffix prebuilt
  version=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])')
  suffix=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  prebuilt=$root/$build/braid_torch-$version/braid_torch
  rm -rf "$site"
  if [[ -f $prebuilt/_C$suffix ]]; then
    mkdir -p "$site"
    cp -r "$prebuilt" "$site/"
    echo "braid_torch: the bundle's, prebuilt for torch $version ($prebuilt)"
  else
    echo "braid_torch: the bundle has none for torch $version and _C$suffix"
    return 1
  fi
}

case $phase in
  build)
    {
      python3 -VV
      python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
      command -v g++ c++ ninja nvcc || true
      # The bundle's first where it fits (the build's minutes would come out of the checks'
      # budget), else one built here; each must import with CUDA.
      if use_prebuilt && works; then
        echo "braid_torch: the bundle's imports here, with CUDA"
      elif build_here && works; then
        echo "braid_torch: built here; it imports, with CUDA"
      else
        echo "braid_torch: neither the bundle's nor one built here imports with CUDA"
        rm -rf "$site"
      fi
    } > "$out/torch-build.txt" 2>&1
    ;;
  checks)
    # Most telling first, both paths each time, as a budget may end the list: DDP and all_reduce at
    # 2 ranks, DDP at 4, then FSDP2, a graph's replays, torchrun, all_reduce at 4.
    for backend in braid nccl; do one "ddp-$backend-2ranks" 150 "$backend" 2 ddp; done
    for backend in braid nccl; do one "allreduce-$backend-2ranks" 90 "$backend" 2 allreduce; done
    for backend in braid nccl; do one "barrier-$backend-2ranks" 60 "$backend" 2 barrier; done
    for backend in braid nccl; do
      one "p2p-first-$backend-2ranks" 60 "$backend" 2 p2p_first torchrun
    done
    for backend in braid nccl; do one "ddp-$backend-4ranks" 150 "$backend" 4 ddp; done
    for backend in braid nccl; do one "fsdp-$backend-2ranks" 120 "$backend" 2 fsdp; done
    for backend in braid nccl; do one "graph-$backend-2ranks" 90 "$backend" 2 graph; done
    for backend in braid nccl; do
      one "torchrun-$backend-4ranks" 120 "$backend" 4 allreduce torchrun
    done
    for backend in braid nccl; do one "allreduce-$backend-4ranks" 90 "$backend" 4 allreduce; done
    ;;
  timing)
    for backend in braid nccl; do one "timing-$backend-2ranks" 90 "$backend" 2 timing; done
    ;;
  *)
    echo "usage: $0 build|checks|timing OUT" >&2
    exit 2
    ;;
esac
exit 0
