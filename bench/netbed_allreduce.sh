#!/usr/bin/env bash
# All-reduce across hosts of the network test bed, every link capped:
# lockstep's direct and ring all-reduce (encrypted), the ring over bf16, and
# plain Gloo's ring, one process per host, for buffers from 4 KiB to
# MAX_MIB. Prints each variant's bus bandwidth as a fraction of the link
# rate (docs/BENCHMARKS.md, "All-reduce against the link's limit").
#
#   bench/netbed_allreduce.sh BUILD_DIR RATE HOSTS [MAX_MIB] [ITERATIONS]
#   e.g. bench/netbed_allreduce.sh build 1gbit 4 64
#
# Needs root (network namespaces); exits 77 otherwise.
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR RATE HOSTS [MAX_MIB] [ITERATIONS]}
rate=${2:?rate, e.g. 1gbit}
hosts=${3:?hosts, 2 or more}
max_mib=${4:-64}
iterations=${5:-5}
if [[ $EUID -ne 0 ]]; then
  echo "netbed_allreduce: the network test bed needs root; skipped" >&2
  exit 77
fi
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/tests/netbed/netbed.sh"
bed=lsnbar
netbed_down "$bed" >/dev/null 2>&1 || true
store=$(mktemp -d)
trap 'netbed_down "$bed" >/dev/null 2>&1 || true; rm -rf "$store"' EXIT
netbed_up "$bed" "$hosts"
netbed_cap_all "$bed" "$rate"
mkdir -p "$store/d" "$store/r" "$store/rh" "$store/gloo"
pids=()
for ((i = 0; i < hosts; i++)); do
  (netbed_exec "$bed" "$i" "$build/bin/netbed_allreduce" --rank "$i" \
     --world "$hosts" --store "$store" --host "$(netbed_addr "$bed" "$i")" \
     --max-mib "$max_mib" --iterations "$iterations" \
     >"$store/rank-$i.out" 2>"$store/rank-$i.err") &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
if ((status != 0)); then
  cat "$store"/rank-*.err >&2
  exit 1
fi
# The link's payload rate in MB/s: tc's units (1gbit = 1e9 bit/s).
link_mb=$(/usr/bin/python3 -c "
import re,sys
m=re.fullmatch(r'([0-9.]+)([kmg]?)bit', sys.argv[1].lower())
print(float(m.group(1))*{'':1,'k':1e3,'m':1e6,'g':1e9}[m.group(2)]/8/1e6)" "$rate")
echo "hosts $hosts, every link capped to $rate ($link_mb MB/s each way)"
awk -v link="$link_mb" 'NR == 1 { printf "%s %9s\n", $0, "of link"; next }
  { printf "%s %9.2f\n", $0, $NF / link }' "$store/rank-0.out"
