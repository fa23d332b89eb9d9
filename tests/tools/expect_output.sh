#!/usr/bin/env bash
# expect_output.sh PATTERN COMMAND [ARGS...]: runs the command, its output shown as it comes (so a
# run ctest stops at its timeout still shows how far it got); passes only when it exits 0 and
# printed a line matching PATTERN (grep -E). ctest's PASS_REGULAR_EXPRESSION alone ignores the
# exit status, so a run that printed its table and then failed (a crash at exit, a rank that died
# late) would pass.
set -uo pipefail
pattern=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if ((rc != 0)); then
  echo "expect_output: $(basename "$1") exited with status $rc" >&2
  exit 1
fi
if ! grep -qE -- "$pattern" "$log"; then
  echo "expect_output: no line matched '$pattern'" >&2
  exit 1
fi
