#!/usr/bin/env bash
# What serving and scraping /metrics costs a job: `lockstep local` training
# the MLP on 2 workers with --metrics-port and a scraper reading the
# coordinator's and both workers' /metrics every second (as Prometheus would
# at a 1 s interval), and without either, alternating in one invocation so
# both see the same machine. Reports, per mode, the median over REPEATS runs
# of training samples/s, and the scraped / plain ratio.
#
#   bench/metrics_overhead.sh [BUILD_DIR] [STEPS] [REPEATS]
#   bench/metrics_overhead.sh BUILD_DIR 5 1      a smoke run
# BENCH_DATA_DIR, when set, is the data.dir of every job (the smoke runs
# point it at bench/tiny_dataset.sh's output).
set -euo pipefail
build=${1:-build}
steps=${2:-400}
repeats=${3:-5}
job=examples/fashion_mnist_mlp.json
data=(${BENCH_DATA_DIR:+--set "data.dir=$BENCH_DATA_DIR"})

results=$(mktemp)
scraper_pid=
cleanup() {
  [ -n "$scraper_pid" ] && kill "$scraper_pid" 2>/dev/null && wait "$scraper_pid" 2>/dev/null
  rm -f "$results"
}
trap cleanup EXIT

# A free run of 3 ports on 127.0.0.1: the coordinator's, then each worker's.
free_base() {
  python3 -c '
import socket
for _ in range(50):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); base = s.getsockname()[1]
    try:
        held = []
        for p in range(base, base + 3):
            t = socket.socket(); held.append(t); t.bind(("127.0.0.1", p))
        print(base); break
    except OSError:
        pass
    finally:
        for t in held: t.close()'
}

# Reads the three /metrics pages every second until killed; counts them.
# exec: the pid that run() kills is the scraper's own.
scrape() {  # base-port count-file
  exec python3 -c '
import sys, time, urllib.request
base, out = int(sys.argv[1]), sys.argv[2]
pages = 0
while True:
    for port in range(base, base + 3):
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=1).read()
            pages += 1
            open(out, "w").write(str(pages))
        except OSError:
            pass
    time.sleep(1)' "$1" "$2"
}

run() {  # mode (scraped|plain) -> appends "mode samples/s pages"
  local flags=() pages=0 count
  count=$(mktemp)
  if [[ $1 == scraped ]]; then
    local base
    base=$(free_base)
    flags=(--metrics-port "$base")
    scrape "$base" "$count" &
    scraper_pid=$!
  fi
  "$build/bin/lockstep" local --workers 2 --json "${flags[@]}" \
      --set max_steps="$steps" "${data[@]}" "$job" 2>/dev/null |
    tail -n 1 >"$count.json"
  if [ -n "$scraper_pid" ]; then
    kill "$scraper_pid" 2>/dev/null; wait "$scraper_pid" 2>/dev/null || true
    scraper_pid=
    pages=$(cat "$count" 2>/dev/null || echo 0)
  fi
  python3 -c '
import json, sys
d = json.load(open(sys.argv[2]))
if d["state"] != "succeeded":
    sys.exit("the %s run %s: %s" % (sys.argv[1], d["state"], d.get("error", "")))
print(sys.argv[1], d["samples_per_second"], sys.argv[3] or 0)' \
      "$1" "$count.json" "${pages:-0}" >>"$results"
  rm -f "$count" "$count.json"
}

for _ in $(seq "$repeats"); do
  run scraped
  run plain
done

python3 - "$results" "$steps" "$repeats" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
def median(mode):
    return statistics.median(float(r[1]) for r in rows if r[0] == mode)
print("MLP on 2 workers (lockstep local), %s steps, median of %s runs each,"
      " scraped every 1 s and not, alternating" % (sys.argv[2], sys.argv[3]))
scraped, plain = median("scraped"), median("plain")
print("%-12s %10s %10s %8s" % ("", "scraped", "plain", "ratio"))
print("%-12s %10.0f %10.0f %8.3f   (samples/s)" % ("training", scraped, plain,
                                                   scraped / plain))
print()
print("each run: mode samples_per_s pages_scraped")
for r in rows:
    print("  %-8s %10.0f %6s" % (r[0], float(r[1]), r[2]))
EOF
