#!/bin/sh
# check_torch.sh MODE SOURCE_DIR SHIM VERSION VENV: braid's libnccl.so.2 in front of the NCCL that
# PyPI's torch brings (the build's Python environment, scripts/python-env.sh; VENV is its folder).
#   symbols: the shim exports every nccl* symbol libtorch_cuda.so imports;
#   import:  with the shim preloaded, `import torch` works and torch.cuda.nccl.version() reports
#            the shim's version (VERSION, as major.minor.patch).
# Exits 77 (skipped) where that torch has no libtorch_cuda.so.
set -eu
mode=$1 source=$2 shim=$3 version=$4 venv=$5
python=$("$source/scripts/python-env.sh" "$venv")
torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
if [ ! -f "$torch_lib/libtorch_cuda.so" ]; then
  echo "skipped: $torch_lib has no libtorch_cuda.so (a CPU-only torch)"
  exit 77
fi
case $mode in
symbols)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  nm -D --undefined-only "$torch_lib/libtorch_cuda.so" | awk '{print $2}' | grep -E '^p?nccl' |
    sed 's/@.*//' | sort -u > "$work/imported"
  nm -D --defined-only "$shim" | awk '{print $3}' | sort -u > "$work/exported"
  missing=$(comm -23 "$work/imported" "$work/exported")
  echo "libtorch_cuda.so imports $(wc -l < "$work/imported") nccl functions"
  [ -z "$missing" ] || { echo "missing from $shim:"; echo "$missing"; exit 1; }
  ;;
import)
  want=$(echo "$version" | sed 's/\./, /g')
  got=$(LD_PRELOAD=$shim "$python" -c 'import torch; print(torch.cuda.nccl.version())')
  echo "with $shim preloaded: import torch works; torch.cuda.nccl.version() = $got"
  [ "$got" = "($want)" ] || { echo "expected ($want), the shim's version"; exit 1; }
  # torch.cuda.nccl.version() is the version torch was built with; what its calls reach is the
  # symbol the process resolves: the file that defines ncclGetVersion there, and its answer.
  reached=$(LD_PRELOAD=$shim "$python" -c '
import ctypes, torch
class Info(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
process = ctypes.CDLL(None)
info, version = Info(), ctypes.c_int()
process.dladdr(ctypes.cast(process.ncclGetVersion, ctypes.c_void_p), ctypes.byref(info))
process.ncclGetVersion(ctypes.byref(version))
print(info.fname.decode(), version.value)')
  echo "ncclGetVersion in that process: $reached"
  [ "$(readlink -f "${reached% *}")" = "$(readlink -f "$shim")" ] ||
    { echo "expected it from $shim"; exit 1; }
  ;;
*) echo "check_torch.sh: mode $mode (expected symbols or import)"; exit 2 ;;
esac
