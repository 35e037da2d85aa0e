#!/usr/bin/env bash
# What a checkpoint costs the training loop: the CNN on 2 local workers with
# no saves (the reference), with asynchronous saves and with synchronous
# saves, every SAVE_EVERY steps, in one invocation; the configurations are
# interleaved so drift in the machine's load hits all of them. Reported, as
# medians of REPEATS runs:
#   - samples/s (training time only) and its ratio to the reference;
#   - the chief's stall per save: how long each save held the training
#     thread (the snapshot to memory, waiting for the previous save, and for
#     a synchronous save the whole write and commit), measured in the trainer.
#
#
#   bench/checkpoint_stall.sh [BUILD_DIR] [STEPS] [SAVE_EVERY] [REPEATS]
#   bench/checkpoint_stall.sh BUILD_DIR 6 3 1     a smoke run
# BENCH_DATA_DIR, when set, is the data.dir of every job (the smoke runs
# point it at bench/tiny_dataset.sh's output).
set -euo pipefail
build=${1:-build}
steps=${2:-300}
every=${3:-25}
repeats=${4:-5}
job=examples/fashion_mnist_cnn.json
data=(${BENCH_DATA_DIR:+--set "data.dir=$BENCH_DATA_DIR"})
backup=$(mktemp -d)
trap 'rm -rf "$backup"' EXIT

run() {  # extra --set arguments -> "samples/s stall_ms"
  rm -rf "${backup:?}"/* "$backup"/.tmp
  "$build/bin/lockstep" local --workers 2 --json --set max_steps="$steps" \
      --set global_batch_size=64 "${data[@]}" "$@" "$job" 2>/dev/null |
    tail -n 1 | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d["samples_per_second"], d["step_breakdown_ms"].get("save_stall", 0))'
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

saves=$(( (steps - 1) / every ))
ckpt=(--set checkpoint.backup_dir="$backup" --set checkpoint.save_every_steps="$every")
none=() async=() sync=()
for _ in $(seq "$repeats"); do
  none+=("$(run)")
  async+=("$(run "${ckpt[@]}")")
  sync+=("$(run "${ckpt[@]}" --set checkpoint.async=false)")
done
col() { printf '%s\n' "$@" | awk -v c="$col" '{print $c}' | median; }
col=1; ref=$(col "${none[@]}")
echo "CNN, 2 workers, global batch 64, $steps steps, a save every $every steps ($saves saves), median of $repeats"
printf "%-28s %12s %8s %16s\n" configuration samples/s ratio "stall/save ms"
report() {  # name runs...
  local name=$1; shift
  col=1; local sps; sps=$(col "$@")
  col=2; local stall; stall=$(col "$@")
  python3 -c "print('%-28s %12.0f %8.3f %16.1f' % ('$name', $sps, $sps / $ref, $stall))"
}
report "no saves (reference)" "${none[@]}"
report "asynchronous saves" "${async[@]}"
report "synchronous saves" "${sync[@]}"
