#!/usr/bin/env bash
# lockstep against PyTorch DDP (Debian's python3-torch, gloo backend) on this
# machine, in one invocation: the same models (MLP, CNN), Adam, global batch
# 128, 1 and 2 workers, threads per worker = cores / workers, and the same
# system BLAS (OpenBLAS, selected by scripts/install-deps). Each cell is the
# median samples/s of REPEATS runs, the two systems interleaved; the ratio is
# lockstep / DDP. Also reported: seconds to the first step (DDP: from
# launching the script to the end of step 1, its processes' start included;
# lockstep: from submitting the job to the chief's report of step 1, the
# workers' start included, as `lockstep local` reports first_step_seconds).
#
#   bench/ddp_compare.sh [BUILD_DIR] [REPEATS]
set -euo pipefail
build=${1:-build}
repeats=${2:-3}
cores=$(nproc)
python=/usr/bin/python3
"$python" -c 'import torch' 2>/dev/null || {
  echo "ddp_compare: needs Debian's python3-torch (apt-get install python3-torch)" >&2
  exit 1
}

lockstep() {  # workers model steps -> samples/s
  local threads=$(( cores / $1 > 0 ? cores / $1 : 1 ))
  OMP_NUM_THREADS=$threads "$build/bin/lockstep" local --workers "$1" --json \
      --threads "$threads" --set model="$2" --set max_steps="$3" \
      --set global_batch_size=128 --set optimizer.type=adam \
      examples/fashion_mnist_mlp.json 2>/dev/null |
    tail -n 1 | "$python" -c 'import json, sys; d = json.load(sys.stdin); print(d["samples_per_second"], d["first_step_seconds"])'
}
ddp() {  # workers model steps -> samples/s
  local threads=$(( cores / $1 > 0 ? cores / $1 : 1 ))
  OMP_NUM_THREADS=$threads "$python" bench/ddp_reference.py \
      --workers "$1" --model "$2" --steps "$3" --global-batch 128 --threads "$threads" |
    tail -n 1 | "$python" -c 'import json, sys; d = json.load(sys.stdin); print(d["samples_per_second"], d["first_step_seconds"])'
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "global batch 128, Adam, threads per worker = $cores cores / workers; median of $repeats"
printf "%-6s %-8s %14s %14s %8s %14s %14s\n" model workers "lockstep s/s" "DDP s/s" ratio \
    "first step: ls" "DDP"
for model in mlp cnn; do
  steps=400; [ "$model" = cnn ] && steps=80
  for workers in 1 2; do
    ours=() theirs=() our_first=() first=()
    for _ in $(seq "$repeats"); do
      read -r sps fs < <(lockstep "$workers" "$model" "$steps")
      ours+=("$sps"); our_first+=("$fs")
      read -r sps fs < <(ddp "$workers" "$model" "$steps")
      theirs+=("$sps"); first+=("$fs")
    done
    a=$(printf '%s\n' "${ours[@]}" | median)
    b=$(printf '%s\n' "${theirs[@]}" | median)
    g=$(printf '%s\n' "${our_first[@]}" | median)
    f=$(printf '%s\n' "${first[@]}" | median)
    printf "%-6s %-8s %14.0f %14.0f %8.2f %14.2f %14.2f\n" "$model" "$workers" "$a" "$b" \
        "$("$python" -c "print($a / $b)")" "$g" "$f"
  done
done
