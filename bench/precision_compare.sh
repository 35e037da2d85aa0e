#!/usr/bin/env bash
# fp32 against bf16 (LibTorch CPU autocast) for the CNN and the ResNet on
# `lockstep local`, interleaved in one invocation: median samples/s of
# REPEATS runs of STEPS steps each, the ratio bf16 / fp32, and the final
# loss and test accuracy of the median run.
#
#
#   bench/precision_compare.sh [BUILD_DIR] [STEPS] [REPEATS] [MODELS] [WORKERS]
#   bench/precision_compare.sh BUILD_DIR 3 1 resnet 2     a smoke run
# MODELS and WORKERS are lists (default "cnn resnet" and "1 2").
# BENCH_DATA_DIR, when set, is the data.dir of every job (the smoke runs
# point it at bench/tiny_dataset.sh's output).
set -euo pipefail
build=${1:-build}
steps=${2:-200}
repeats=${3:-3}
models=${4:-cnn resnet}
worker_counts=${5:-1 2}
data=(${BENCH_DATA_DIR:+--set "data.dir=$BENCH_DATA_DIR"})

run() {  # model workers precision -> samples/s loss accuracy
  "$build/bin/lockstep" local --workers "$2" --json --set model="$1" \
      --set precision="$3" --set max_steps="$steps" --set global_batch_size=64 \
      "${data[@]}" examples/fashion_mnist_mlp.json 2>/dev/null |
    tail -n 1 | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["samples_per_second"], d["final_loss"], d["test_accuracy"])'
}
median_row() { sort -g | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'; }

echo "global batch 64, $steps steps, median of $repeats"
printf "%-7s %-3s %12s %12s %7s %22s %22s\n" model W "fp32 s/s" "bf16 s/s" ratio \
    "fp32 loss / acc" "bf16 loss / acc"
for model in $models; do
  for workers in $worker_counts; do
    fp32=() bf16=()
    for _ in $(seq "$repeats"); do
      fp32+=("$(run "$model" "$workers" fp32)")
      bf16+=("$(run "$model" "$workers" bf16)")
    done
    read -r a al aa < <(printf '%s\n' "${fp32[@]}" | median_row)
    read -r b bl ba < <(printf '%s\n' "${bf16[@]}" | median_row)
    printf "%-7s %-3s %12.0f %12.0f %7.2f %13.4f / %6.4f %13.4f / %6.4f\n" "$model" "$workers" \
        "$a" "$b" "$(python3 -c "print($b / $a)")" "$al" "$aa" "$bl" "$ba"
  done
done
