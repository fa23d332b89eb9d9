#!/usr/bin/env bash
# The layering check must fail on an upward include: copies the checked folders and the table into
# a scratch tree, plants `#include "core/comm.h"` in base/error.h, and expects
# check_layering.sh to fail naming that line (and to pass on the unplanted copy first).
set -euo pipefail
root="$1"
here="$(cd "$(dirname "$0")" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cd "$root"
cp -r --parents docs/layering.md base src include transport topology shim tools examples python/csrc \
  python/braid_torch "$scratch"
"$here/check_layering.sh" "$scratch" >/dev/null || { echo "the unplanted copy already fails"; exit 1; }
sed -i '0,/^#include/s//#include "core\/comm.h"\n#include/' "$scratch/base/error.h"
if output="$("$here/check_layering.sh" "$scratch")"; then
  echo "check_layering passed a tree with base/error.h including core/comm.h"
  exit 1
fi
echo "$output" | grep -q 'base/error.h:[0-9]*: includes "core/comm.h"' ||
  { echo "check_layering failed without naming the planted include:"; echo "$output"; exit 1; }
echo "check_layering refused the planted include: $(echo "$output" | grep 'core/comm.h')"
