#!/bin/sh
# run_fuzzer.sh FUZZER SEEDS CORPUS SECONDS [DICT]: runs one libFuzzer target for SECONDS, starting
# from the seed files (the shared topology files, or seeds/ here, findings kept there as regression
# inputs); findings are written next to CORPUS as CORPUS-crash-<hash>.
# Exits 77 (ctest: skipped) when the seeds are not there; a finding exits 1 (libFuzzer's default
# exit code for one is 77, hence -error_exitcode).
fuzzer=$1 seeds=$2 corpus=$3 seconds=$4 dict=$5
if [ ! -d "$seeds" ]; then
  echo "skipped: no seed corpus at $seeds (../shared/topologies is not here)"
  exit 77
fi
mkdir -p "$corpus"
exec "$fuzzer" -max_total_time="$seconds" -timeout=30 -error_exitcode=1 -rss_limit_mb=2048 -max_len=65536 \
  ${dict:+-dict="$dict"} -artifact_prefix="$corpus-" -print_final_stats=1 "$corpus" "$seeds"
