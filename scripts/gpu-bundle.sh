#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs (the GPU test programs, braid-perf, nccl-perf (NVIDIA's NCCL
# measured alike, bench/peers) and libnccl.so.2, Release,
# sm_90 + PTX) into build-gpu/, and gathers them into build-carry/ with the shared libraries they need from
# this machine (Debian's fmt, hwloc, UCX, pugixml, numa; about 25 MB), for a GPU machine that has
# the CUDA driver but none of braid's packages and no network. There, from the repository root:
#
#   LD_LIBRARY_PATH=$PWD/build-carry/lib BRAID_BUILD_DIR=build-carry scripts/gpu-check.sh
#
# (the device tool: carry ["build-carry"]). CUDA's runtime is linked statically.
set -euo pipefail
cd "$(dirname "$0")/.."
programs=(test_gpu_kernels test_gpu_comm test_gpu_ipc test_gpu_dp test_gpu_hosts)
tools=(braid-perf braid-topo)
# libnccl.so.2 from the newest nccl.h at hand: the Python environment's (PyPI's NCCL wheel, which
# scripts/python-env.sh put in build/venv) where there is one, so the shim serves a lent machine's
# torch whichever NCCL it was built for (the toolkit's 2.28 lacks symbols torch 2.15 imports).
if [[ -d build/venv && ! -e build-gpu/venv ]]; then
  mkdir -p build-gpu
  ln -s ../build/venv build-gpu/venv
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DBRAID_BUILD_BENCH=ON > /dev/null
cmake --build build-gpu -j"$(nproc)" --target "${programs[@]}" "${tools[@]}" nccl-perf gpu-launch-costs nccl_shim
rm -rf build-carry
mkdir -p build-carry/tests build-carry/tools build-carry/lib build-carry/shim
# Apart from lib/ (on LD_LIBRARY_PATH there): torch preloads it for its nccl backend only. A file,
# not the build's links, as the libraries below (what a carry keeps of links is not promised).
cp -L build-gpu/shim/libnccl.so.2 build-carry/shim/
for program in "${programs[@]}"; do cp "build-gpu/tests/$program" build-carry/tests/; done
for tool in "${tools[@]}"; do cp "build-gpu/tools/$tool" build-carry/tools/; done
cp build-gpu/bench/peers/nccl-perf build-gpu/bench/gpu-launch-costs build-carry/tools/
# Every library the programs load that is not the C/C++ runtime or the driver: braid's own and
# Debian's (the GPU machine's C++ runtime is at least as new).
ldd build-carry/tests/* build-carry/tools/* | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/lib(c|m|pthread|dl|rt|gcc_s|stdc\+\+|udev|cuda)\.so' |
  while read -r library; do cp -L "$library" build-carry/lib/; done
# braid_torch prebuilt for the torch lent machines had (run 3: 2.11.0+cu130) and this Python,
# for one that cannot build it (gpu-torch.sh tries that first). Best effort: PyPI may be out of
# reach, or have no wheel for this Python.
scripts/prebuild-braid-torch.sh 2.11.0 build-carry/braid_torch-2.11.0 ||
  echo "gpu-bundle: no prebuilt braid_torch for torch 2.11.0 (the lent machine builds its own)"
echo "build-carry: $(du -sh build-carry | cut -f1); libraries: $(ls build-carry/lib | tr '\n' ' ')"
