#!/usr/bin/env bash
# Training throughput of `lockstep local` on 1 and 2 workers, measured in one
# invocation so the ratio is meaningful on a shared, noisy machine. The
# 1-worker run is the reference; each configuration runs REPEATS times and
# the median samples/s is reported.
#
#
#   bench/train_scaling.sh [BUILD_DIR] [STEPS] [REPEATS]
#   bench/train_scaling.sh BUILD_DIR 5 1      a smoke run
# BENCH_DATA_DIR, when set, is the data.dir of every job (the smoke runs
# point it at bench/tiny_dataset.sh's output).
set -euo pipefail
build=${1:-build}
steps=${2:-400}
repeats=${3:-3}
job=examples/fashion_mnist_mlp.json
data=(${BENCH_DATA_DIR:+--set "data.dir=$BENCH_DATA_DIR"})

# One run; prints samples/s and appends the chief's step split to $splits.
splits=$(mktemp)
trap 'rm -f "$splits"' EXIT
run() {  # workers per_replica_batch [extra --set] -> samples/s
  "$build/bin/lockstep" local --workers "$1" --json \
      --set per_replica_batch_size="$2" --set max_steps="$steps" ${3:+--set "$3"} \
      "${data[@]}" "$job" 2>/dev/null |
    tail -n 1 | python3 -c '
import json, sys
d = json.load(sys.stdin)
b = d["step_breakdown_ms"]
with open(sys.argv[1], "a") as f:
    f.write("%s %.3f %.3f %.3f %.3f %.3f\n" % (sys.argv[2], b["data"], b["forward"],
            b["backward"], b["exposed_comm"], b["optimizer"]))
print(d["samples_per_second"])' "$splits" "$1x$2${3:+,$3}"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "MLP, global batch 128, $steps steps, median of $repeats runs"
printf "%-34s %12s %8s\n" "configuration" "samples/s" "ratio"
ref=$(for _ in $(seq "$repeats"); do run 1 128; done | median)
printf "%-34s %12.0f %8.2f\n" "1 worker  x 128 (reference)" "$ref" 1
two=$(for _ in $(seq "$repeats"); do run 2 64; done | median)
printf "%-34s %12.0f %8.2f\n" "2 workers x 64 (same global batch)" "$two" \
    "$(python3 -c "print($two / $ref)")"
serial=$(for _ in $(seq "$repeats"); do run 2 64 communication.overlap=false; done | median)
printf "%-34s %12.0f %8.2f\n" "2 workers x 64, no overlap" "$serial" \
    "$(python3 -c "print($serial / $ref)")"

echo
echo "chief's step time split, ms per step (each run):"
printf "%-40s %6s %8s %9s %13s %10s\n" configuration data forward backward exposed_comm optimizer
sort "$splits" | awk '{printf "%-40s %6s %8s %9s %13s %10s\n", $1, $2, $3, $4, $5, $6}'
