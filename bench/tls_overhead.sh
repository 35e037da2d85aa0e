#!/usr/bin/env bash
# What mutual TLS costs a job: `lockstep local` training the MLP on 2 workers
# with TLS (its default) and with --insecure, alternating in one invocation
# so both see the same machine. Reports, per mode, the median over REPEATS
# runs of the time from submitting the job to its first step, of the
# processes' start-up (up and registered) and of training samples/s, and
# the TLS / insecure ratio of each.
#
#   bench/tls_overhead.sh [BUILD_DIR] [STEPS] [REPEATS]
#   bench/tls_overhead.sh BUILD_DIR 5 1      a smoke run
# BENCH_DATA_DIR, when set, is the data.dir of every job (the smoke runs
# point it at bench/tiny_dataset.sh's output).
set -euo pipefail
build=${1:-build}
steps=${2:-400}
repeats=${3:-5}
job=examples/fashion_mnist_mlp.json
data=(${BENCH_DATA_DIR:+--set "data.dir=$BENCH_DATA_DIR"})

results=$(mktemp)
trap 'rm -f "$results"' EXIT

run() {  # mode (tls|insecure) -> appends "mode first_step startup samples/s"
  local flags=()
  [[ $1 == insecure ]] && flags=(--insecure)
  "$build/bin/lockstep" local --workers 2 --json "${flags[@]}" \
      --set max_steps="$steps" "${data[@]}" "$job" 2>/dev/null |
    tail -n 1 | python3 -c '
import json, sys
d = json.load(sys.stdin)
if d["state"] != "succeeded":
    sys.exit("the %s run %s: %s" % (sys.argv[1], d["state"], d.get("error", "")))
print(sys.argv[1], d["first_step_seconds"], d["startup_seconds"],
      d["samples_per_second"])' "$1" >>"$results"
}

for _ in $(seq "$repeats"); do
  run tls
  run insecure
done

python3 - "$results" "$steps" "$repeats" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
def median(mode, column):
    return statistics.median(float(r[column]) for r in rows if r[0] == mode)
print("MLP on 2 workers (lockstep local), %s steps, median of %s runs each,"
      " TLS and --insecure alternating" % (sys.argv[2], sys.argv[3]))
print("%-28s %10s %10s %8s" % ("", "TLS", "insecure", "ratio"))
for name, column, unit in (("submit to first step", 1, "s"),
                           ("start-up (registered)", 2, "s"),
                           ("training", 3, "samples/s")):
    tls, plain = median("tls", column), median("insecure", column)
    print("%-28s %10.3f %10.3f %8.3f   (%s)" % (name, tls, plain,
                                                tls / plain, unit))
print()
print("each run: mode first_step_s startup_s samples_per_s")
for r in rows:
    print("  %-9s %8.3f %8.3f %10.0f" % (r[0], float(r[1]), float(r[2]),
                                         float(r[3])))
EOF
