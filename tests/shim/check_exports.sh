#!/bin/sh
# check_exports.sh LIBRARY INCLUDE_DIR CXX: the shim exports exactly the functions that the
# toolkit's nccl.h declares (nccl* and pnccl*): a function a new header adds shows up here.
set -eu
lib=$1 include=$2 cxx=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#include <nccl.h>\n' | "$cxx" -E -P -I"$include" -x c++ - |
  grep -oE '\bp?nccl[A-Z][A-Za-z0-9]*[[:space:]]*\(' | sed -E 's/[[:space:]]*\($//' | sort -u \
  > "$work/declared"
nm -D --defined-only "$lib" | awk '{print $3}' | grep -E '^p?nccl' | sort -u > "$work/exported"
missing=$(comm -23 "$work/declared" "$work/exported")
extra=$(comm -13 "$work/declared" "$work/exported")
echo "nccl.h declares $(wc -l < "$work/declared") functions; $lib exports $(wc -l < "$work/exported")"
[ -z "$missing" ] || { echo "missing from the shim:"; echo "$missing"; }
[ -z "$extra" ] || { echo "exported but not in nccl.h:"; echo "$extra"; }
[ -z "$missing" ] && [ -z "$extra" ]
