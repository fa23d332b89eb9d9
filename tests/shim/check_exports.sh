#!/bin/sh
# check_exports.sh LIBRARY CXX CUDA_INCLUDE_DIR NCCL_INCLUDE_DIR...: the shim exports every function
# that each nccl.h given declares (nccl* and pnccl*), and the host entry points of its device API
# (nccl_device/: NCCL_EXTERN_C __host__ declarations, Windows' stub aside), and nothing that none of
# them declares: a function a new header adds shows up here.
set -eu
lib=$1 cxx=$2 cuda=$3
shift 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nm -D --defined-only "$lib" | awk '{print $3}' | grep -E '^p?nccl' | sort -u > "$work/exported"
: > "$work/all"
failed=0
for include in "$@"; do
  {
    printf '#include <nccl.h>\n' | "$cxx" -E -P -I"$include" -I"$cuda" -x c++ - |
      grep -oE '\bp?nccl[A-Z][A-Za-z0-9]*[[:space:]]*\(' | sed -E 's/[[:space:]]*\($//'
    # Functions the header declares on some platforms and makes macros on others (nccl.h 2.30's
    # ncclResetDebugInit): its library exports them still.
    printf '#include <nccl.h>\n' | "$cxx" -E -dM -I"$include" -I"$cuda" -x c++ - |
      grep -oE '^#define p?nccl[A-Z][A-Za-z0-9]*\(\)' | sed -E 's/^#define //; s/\(\)$//'
    for header in "$include"/nccl_device/*.h; do
      grep -q 'for Windows builds only' "$header" && continue
      tr '\n' ' ' < "$header" |
        grep -oE 'NCCL_EXTERN_C[[:space:]]+__host__[[:space:]]+[A-Za-z_0-9]+[[:space:]]+nccl[A-Za-z0-9]*[[:space:]]*\(' |
        sed -E 's/.*[[:space:]](nccl[A-Za-z0-9]*)[[:space:]]*\($/\1/'
    done
  } | sort -u > "$work/declared"
  cat "$work/declared" >> "$work/all"
  version=$(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$include/nccl.h" | awk '{print $3}' | paste -sd.)
  missing=$(comm -23 "$work/declared" "$work/exported")
  echo "nccl.h $version ($include) and its device API declare $(wc -l < "$work/declared") functions"
  [ -z "$missing" ] || { echo "missing from the shim:"; echo "$missing"; failed=1; }
done
sort -u "$work/all" -o "$work/all"
extra=$(comm -13 "$work/all" "$work/exported")
echo "$lib exports $(wc -l < "$work/exported")"
[ -z "$extra" ] || { echo "exported but declared by none of the headers:"; echo "$extra"; failed=1; }
exit $failed
