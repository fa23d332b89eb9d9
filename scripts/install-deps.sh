#!/usr/bin/env bash
# Installs the Debian packages braid's build, tests and benchmarks need. Idempotent; run as root.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev libfmt-dev
  openmpi-bin libopenmpi-dev libgloo-dev gnuplot-nox
  iproute2 procps iperf3
  libcli11-dev nlohmann-json3-dev
  libhwloc-dev libpugixml-dev clang libclang-rt-14-dev
  libucx-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
