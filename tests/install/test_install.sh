#!/usr/bin/env bash
# Installs the build into a fresh prefix and uses it as a user would: a CMake project
# (find_package(braid): braid::braid, braid::dp) and a pkg-config compile, both building the
# examples out of tree and running them, then the installed braid-perf and braid-topo.
# Usage: test_install.sh <build dir> <source dir>
set -euo pipefail
build="$1" src="$2"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
prefix="$scratch/prefix"

cmake --install "$build" --prefix "$prefix" >"$scratch/install.log"
for f in include/braid/braid.h include/braid/dp.hpp bin/braid-perf bin/braid-topo \
  lib/cmake/braid/braidConfig.cmake lib/pkgconfig/braid.pc lib/pkgconfig/braid-dp.pc; do
  [[ -e "$prefix/$f" ]] || { echo "not installed: $f"; exit 1; }
done
soname="$(objdump -p "$prefix/lib/libbraid.so" | awk '/SONAME/ { print $2 }')"
[[ "$soname" == libbraid.so.0 ]] || { echo "libbraid's soname is '$soname', expected libbraid.so.0"; exit 1; }
echo "installed into $prefix: $(cd "$prefix" && find . -type f | wc -l) files, libbraid soname $soname"

# 1. CMake: find_package(braid) from the prefix only.
cmake -S "$src/tests/install/consumer" -B "$scratch/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DEXAMPLES="$src/examples" >"$scratch/consumer.log"
cmake --build "$scratch/consumer" >>"$scratch/consumer.log"
if ldd "$scratch/consumer/hello_allreduce" | grep -q "$build"; then
  echo "the CMake consumer links braid from the build tree, not the prefix"; exit 1
fi
"$scratch/consumer/hello_allreduce"
"$scratch/consumer/train_mlp" --mode ddp --ranks 2 --launch threads --steps 3

# 2. pkg-config: a plain compile and link.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc "$src/examples/hello_allreduce.c" $(pkg-config --cflags --libs braid) -Wl,-rpath,"$prefix/lib" \
  -o "$scratch/hello_pc"
"$scratch/hello_pc"
echo "pkg-config braid-dp: $(pkg-config --libs braid-dp)"

# 3. The installed tools run on the installed library.
"$prefix/bin/braid-perf" allreduce -b 8 -e 64K -f 64 --np 2 -c 1 -n 2 -w 1 | tail -3
"$prefix/bin/braid-topo" >/dev/null
echo "install test passed"
