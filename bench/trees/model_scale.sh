#!/usr/bin/env bash
# The cost model's all-reduce predictions from 8 to 4096 ranks, every algorithm forced in turn
# (BRAID_ALGO), as braid-topo --plan prints them (issue 36, scope 4), in Markdown:
#   - CPU ranks, one per host (this machine's live topology as each host, a NIC each);
#   - GPU ranks, 8 per host, on Azure NDv5's topology file (the HGX H100 board as inferred).
#   - CPU ranks, 2 per host (this 2-core machine: a rank and its network proxy each, more busy
#     threads than cores): the flat log-step forms beside the hierarchical ones.
# Beside them, the network steps NCCL's double binary tree pays between hosts (2 log2(hosts)) at
# the model's own network hop. Usage: model_scale.sh [BUILD_DIR] > bench/results/model_scale.md; then
# bench/trees/plot_model_scale.py draws docs/model_scale.png from it.
set -euo pipefail
cd "$(dirname "$0")/../.."
topo=${1:-build}/tools/braid-topo
ndv5=../shared/topologies/xml/azure_ndv5_h100_nccl_topo.xml
sizes="8 32768 2097152 134217728"

# row ALGO ARGS...: the all-reduce column (us) and the algorithm used, at each of $sizes.
row() {
  local algo=$1
  shift
  BRAID_ALGO=$algo "$topo" --plan "$@" 2>&1 | awk -v sizes="$sizes" '
    BEGIN { n = split(sizes, want, " "); for (i = 1; i <= n; ++i) keep[want[i]] = i }
    /^ +[0-9]+ / && ($1 in keep) { cell[keep[$1]] = sprintf("%.0f (%s)", $2, $8) }
    END { line = ""; for (i = 1; i <= n; ++i) line = line " | " cell[i]; print line " |" }'
}
hop_us() {
  "$topo" --plan "$@" 2>&1 | sed -n 's/.*network hop \([0-9.]*\) us.*/\1/p' | head -1
}

header="| ranks | algorithm | 8 B | 32 KiB | 2 MiB | 128 MiB |"
rule="|---|---|---|---|---|---|"
echo "### CPU ranks, one per host (us, and the algorithm that ran)"
echo
echo "$header"
echo "$rule"
for hosts in 8 16 64 256 1024 4096; do
  for algo in ring direct doubling halving tree; do
    echo "| $hosts | $algo$(row "$algo" --hosts "$hosts")"
  done
done
echo
echo "### CPU ranks, 2 per host on this 2-core machine (us, and the algorithm that ran)"
echo
echo "$header"
echo "$rule"
for hosts in 4 32 512 2048; do
  for algo in ring doubling halving hier-doubling hier-halving; do
    echo "| $((hosts * 2)) | $algo$(row "$algo" --ranks-per-host 2 --hosts "$hosts")"
  done
done
net=$(hop_us --hosts 8)
echo
awk -v h="$net" 'BEGIN {
  printf "A double binary tree'"'"'s network steps alone, 2 log2(hosts) at the model'"'"'s network hop (%s us):", h
  for (n = 8; n <= 4096; n *= 8) printf " %d hosts %.0f us;", n, 2 * log(n) / log(2) * h
  print ""
}' 
echo
echo "### GPU ranks, 8 per host on Azure NDv5 (us, and the algorithm and protocol that ran)"
echo
echo "$header"
echo "$rule"
for hosts in 1 2 8 32 128 512; do
  for algo in ring tree; do
    echo "| $((hosts * 8)) | $algo$(row "$algo" --file "$ndv5" --hosts "$hosts")"
  done
done
