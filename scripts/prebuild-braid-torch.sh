#!/usr/bin/env bash
# prebuild-braid-torch.sh TORCH_VERSION OUT: braid_torch (python/, CUDA side included) compiled
# here against PyPI's torch TORCH_VERSION for this machine's Python (its ABI tag, e.g. cp311),
# into OUT/braid_torch, for a lent GPU machine that has that torch and Python but cannot build the
# extension itself (scripts/gpu-torch.sh tries that first). The wheel is downloaded (no
# dependencies) and only its headers and the libraries the extension links are unpacked, not
# installed, so python/setup.py (which imports torch) cannot build it: the flags here are those
# torch's BuildExtension gives for that torch (C++17). The CUDA runtime's headers come from
# build/venv's NVIDIA wheel. Called by gpu-bundle.sh, after it has built build-gpu/src/libbraid.so.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$1
out=$2
python=build/venv/bin/python
cuda=$("$python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')
abi=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
work=build-gpu/torch-$version
mkdir -p "$work"
"$python" -m pip download --quiet --no-deps "torch==$version" -d "$work"
wheel=$(ls "$work"/torch-"$version"*-"$abi"-*.whl)
(cd "$work" && unzip -q -o "$(basename "$wheel")" 'torch/include/*' 'torch/lib/libc10*.so' \
  'torch/lib/libtorch.so' 'torch/lib/libtorch_cpu.so' 'torch/lib/libtorch_python.so' \
  'torch/lib/libtorch_cuda.so')
torch=$work/torch
rm -rf "$out"
mkdir -p "$out/braid_torch" "$work/obj"
cp python/braid_torch/__init__.py "$out/braid_torch/"
for source in python/csrc/*.cc; do  # every source: the CUDA side is built here
  g++ -O2 -fPIC -std=c++17 -DNDEBUG -DBRAID_TORCH_CUDA -DTORCH_EXTENSION_NAME=_C \
    -DTORCH_API_INCLUDE_EXTENSION_H -D_GLIBCXX_USE_CXX11_ABI=1 -Iinclude -I"$cuda/include" \
    -I"$torch/include" -I"$torch/include/torch/csrc/api/include" -I"$include" \
    -c "$source" -o "$work/obj/$(basename "$source" .cc).o"
done
g++ -shared "$work"/obj/*.o -o "$out/braid_torch/_C$suffix" \
  -L"$torch/lib" -lc10 -ltorch -ltorch_cpu -ltorch_python -lc10_cuda -ltorch_cuda \
  -Lbuild-gpu/src -lbraid -L"$cuda/lib" -l:libcudart.so.13
strip --strip-debug "$out"/braid_torch/_C.*.so
echo "braid_torch for torch $version ($abi): $out"
