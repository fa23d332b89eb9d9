#!/usr/bin/env bash
# The network transport's numbers, in one run on two namespace hosts joined by veth and a bridge
# (netns_hosts.sh), one rank on each:
#   1. the raw link: iperf3 --bidir (both directions at once), per direction, before and after
#      the rest, so that drift of a shared machine shows;
#   2. braid-perf all-reduce, 8 B .. 256 MiB (nccl-tests' table; time is the mean of -n iterations),
#      over braid's sockets and over UCX (TCP underneath);
#   3. braid next to OpenMPI's MPI_Allreduce over TCP (btl self,tcp: no shared memory), alternating
#      in rounds, median of per-op times (bench/allreduce_vs_mpi under mpirun), once per network;
#   4. a summary at every size: braid over sockets and over UCX against MPI (each against the MPI
#      times of its own interleaved run), and braid's busbw against the link.
# Usage (root): tests/multihost/bench_net.sh BUILD_DIR [OUTPUT]
#   BUILD_DIR must hold tools/braid-perf and bench/allreduce_vs_mpi; OUTPUT defaults to
#   bench/results/net_2hosts.txt. Needs iperf3 (scripts/install-deps.sh) and Open MPI.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ -z "${BRAID_TEST_NETNS:-}" ]; then
  [ $# -ge 1 ] || { echo "usage: bench_net.sh BUILD_DIR [OUTPUT]" >&2; exit 2; }
  build="$(cd "$1" && pwd)"
  output="${2:-$repo/bench/results/net_2hosts.txt}"
  exec "$here/netns_hosts.sh" --hosts 2 -- "$0" "$build" "$output"
fi
build="$1"
output="$2"
perf="$build/tools/braid-perf"
vs_mpi="$build/bench/allreduce_vs_mpi"
for tool in "$perf" "$vs_mpi" "$(command -v iperf3 || echo iperf3)" "$(command -v mpirun || echo mpirun)"; do
  [ -x "$tool" ] || { echo "bench_net.sh: $tool is missing" >&2; exit 1; }
done

IFS=, read -r h0 h1 <<< "$BRAID_TEST_NETNS"
a0=10.77.0.1
a1=10.77.0.2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

{
  echo "# braid network transport: 2 ranks on 2 hosts (network namespaces, veth + bridge)"
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')," \
    "$(nproc) cores; Linux $(uname -r)"
  echo "# braid $(git -C "$repo" describe --always --dirty 2> /dev/null || echo '?');" \
    "$(iperf3 --version | head -1 | cut -d' ' -f1-2); $(mpirun --version | head -1)"
  echo "# tcp congestion control $(ip netns exec "$h0" sysctl -n net.ipv4.tcp_congestion_control);" \
    "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# braid settings: BRAID_NSOCKS=${BRAID_NSOCKS:-default} BRAID_BUFFSIZE=${BRAID_BUFFSIZE:-default};" \
    "UCX runs: BRAID_NET=ucx UCX_TLS=tcp ($(dpkg-query -W -f='libucx0 ${Version}' libucx0 2> /dev/null || echo 'UCX'))"
  echo
} > "$work/header"

# 1. The raw link, both directions at once (the one-off server exits after its client).
run_iperf3() {
  ip netns exec "$h1" iperf3 --server --one-off --daemon --bind "$a1" > /dev/null
  sleep 0.5
  iperf3 --client "$a1" --bidir --time 10 --format m > "$1"
}
run_iperf3 "$work/iperf3.before"

nets=(socket ucx)
net_env() {  # the environment of braid's ranks over network $1
  if [ "$1" = ucx ]; then echo BRAID_NET=ucx UCX_TLS=tcp; else echo BRAID_NET=socket; fi
}

# 2. braid-perf, one rank per host, started like any launcher would.
run_perf() {
  local rank=$1 ns=$2 net=$3
  env $(net_env "$net") BRAID_COMM_ID="$a0:29500" RANK=$rank WORLD_SIZE=2 \
    ip netns exec "$ns" "$perf" allreduce -b 8 -e 256M -f 2 -w 5 -n 20 -c 1
}
for net in "${nets[@]}"; do
  run_perf 1 "$h1" "$net" > "$work/perf1.$net" 2>&1 &
  run_perf 0 "$h0" "$net" > "$work/perf0.$net" 2>&1
  wait
done

# 3. braid and OpenMPI side by side: mpirun reaches host 1 through netns_rsh.sh.
for net in "${nets[@]}"; do
  mpirun --allow-run-as-root --bind-to none -np 2 --host "$a0,$a1" \
    --mca plm_rsh_agent "$here/netns_rsh.sh" --mca pml ob1 --mca btl self,tcp \
    --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    $(for e in $(net_env "$net"); do echo -x "$e"; done) \
    "$vs_mpi" -b 8 -e 256M -f 2 -r 4 > "$work/vs_mpi.$net" 2>&1
done

run_iperf3 "$work/iperf3.after"

# 4. Per size: braid over each network against the MPI times of its own run (bar: braid's time at
# most MPI's), and braid's busbw against the link's mean per-direction rate.
link_gbs="$(awk '/receiver/ && /(TX|RX)-C/ {for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") {
  sum += $(i - 1); n++ }} END { if (n) printf "%.3f", sum / n / 8000 }' "$work"/iperf3.*)"
summary="$(awk -v link="$link_gbs" '
  FNR == 1 { net++ }
  $1 ~ /^[0-9]+$/ && NF >= 9 {
    if (net == 1) sizes[++n] = $1
    braid[net, $1] = $3; mpi[net, $1] = $4; gbs[net, $1] = $7
  }
  END {
    for (i = 1; i <= n; i++) {
      s = sizes[i]; line = sprintf("%12d", s)
      for (k = 1; k <= 2; k++) {
        r = braid[k, s] / mpi[k, s]; met[k] += (r <= 1)
        line = line sprintf(" %10.2f %10.2f %6.2f %5.0f%%", braid[k, s], mpi[k, s], r, 100 * gbs[k, s] / link)
      }
      print line
    }
    printf "# braid time <= MPI time at %d of %d sizes over sockets, %d of %d over UCX\n", met[1], n, met[2], n
  }' "$work/vs_mpi.socket" "$work/vs_mpi.ucx")"

{
  cat "$work/header"
  echo "## 1. Raw TCP over the veth link: iperf3 --bidir, 10 s (TX-C: host 0 -> 1, RX-C: 1 -> 0)"
  for when in before after; do
    echo "# $when the braid and MPI runs:"
    grep -E "(sender|receiver)$" "$work/iperf3.$when"
  done
  echo "# mean per direction (receiver side, both runs): $link_gbs GB/s"
  echo
  for net in "${nets[@]}"; do
    echo "## 2. braid-perf allreduce over $net, rank 0 on host 0, rank 1 on host 1 (out of bounds = wrong values)"
    grep -vE "^vm:|BRAID|^\[" "$work/perf0.$net"
    echo
  done
  for net in "${nets[@]}"; do
    echo "## 3. braid over $net vs OpenMPI MPI_Allreduce over TCP (btl self,tcp), same hosts, alternating rounds"
    grep -vE "^vm:|BRAID|^\[" "$work/vs_mpi.$net"
    echo
  done
  echo "## 4. braid over sockets and over UCX vs MPI, medians from section 3 (ratio = braid/MPI time;"
  echo "##    busbw as a share of the link's mean per-direction rate, $link_gbs GB/s, from section 1)"
  printf "%12s %10s %10s %6s %6s %10s %10s %6s %6s\n" "size(B)" "sock(us)" "mpi(us)" "ratio" \
    "link" "ucx(us)" "mpi(us)" "ratio" "link"
  echo "$summary"
} | tee "$output"
