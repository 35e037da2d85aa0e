#!/usr/bin/env bash
# lockstep against PyTorch DDP (Debian's python3-torch, gloo backend) on this
# machine, in one invocation: the same models (MLP, CNN), Adam, global batch
# 128, 1 and 2 workers, threads per worker = cores / workers, and the same
# system BLAS (OpenBLAS, selected by scripts/install-deps). Each cell is the
# median samples/s of REPEATS runs, the systems interleaved.
#
# Two DDP columns: as launched by default, and with glibc's allocator told
# what the lockstep worker tells it (keep large blocks in the heap:
# MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_), so the table separates
# that setting from everything else.
#
# Time to the first step: lockstep's "job" is from submitting the job to
# running workers to the chief's report of step 1 (`lockstep local` waits
# for its workers to register first, as daemons on a cluster are); "cold"
# adds starting the processes. DDP's is from launching the script to the
# end of step 1, its processes' start included (cold).
#
# DDP_COMPARE_PRECISION=bf16 trains both in bf16: lockstep's precision
# "bf16", DDP's forward pass and loss under torch.autocast("cpu",
# torch.bfloat16).
#
# Without python3-torch it exits 77 (ctest's bench smoke counts that as a
# skip). STEPS overrides the steps of both models (400 MLP, 120 CNN;
# "default" or "" for those).
#
# --check MIN: exit 1 when lockstep / (DDP + heap) is below MIN in any cell
# (the cells that fell are named); a cell below it is measured again, up to
# twice, and fails only if it stays below. The plain DDP column is not run
# then (printed as nan). For a machine of one's own, alone: `make test`
# does not check ratios (issue 51: the 0.8 check failed on a shared machine
# where nothing had changed); its smoke runs every cell once, 20 steps.
#
#   bench/ddp_compare.sh [BUILD_DIR] [REPEATS] [STEPS] [--check MIN]
#   bench/ddp_compare.sh BUILD_DIR 1 20                    make test's smoke
#   bench/ddp_compare.sh BUILD_DIR 3 default --check 0.8   a regression check
set -euo pipefail
build=${1:-build}
repeats=${2:-3}
steps_override=${3:-}
[ "$steps_override" = default ] && steps_override=""
check_min=""
if [ "${4:-}" = --check ]; then
  check_min=${5:?--check needs the lowest ratio allowed, e.g. 0.8}
fi
cores=$(nproc)
precision=${DDP_COMPARE_PRECISION:-fp32}
python=/usr/bin/python3
"$python" -c 'import torch' 2>/dev/null || {
  echo "ddp_compare: needs Debian's python3-torch (apt-get install python3-torch)" >&2
  exit 77
}

lockstep() {  # workers model steps -> samples/s, job first step, cold first step
  local threads=$(( cores / $1 > 0 ? cores / $1 : 1 ))
  OMP_NUM_THREADS=$threads "$build/bin/lockstep" local --workers "$1" --json \
      --threads "$threads" --set model="$2" --set max_steps="$3" \
      --set global_batch_size=128 --set optimizer.type=adam --set precision="$precision" \
      examples/fashion_mnist_mlp.json 2>/dev/null |
    tail -n 1 | "$python" -c 'import json, sys; d = json.load(sys.stdin); print(d["samples_per_second"], d["first_step_seconds"], d["startup_seconds"] + d["first_step_seconds"])'
}
ddp() {  # workers model steps [env...] -> samples/s, cold first step
  local threads=$(( cores / $1 > 0 ? cores / $1 : 1 ))
  env OMP_NUM_THREADS=$threads "${@:4}" "$python" bench/ddp_reference.py \
      --workers "$1" --model "$2" --steps "$3" --global-batch 128 --threads "$threads" \
      --precision "$precision" |
    tail -n 1 | "$python" -c 'import json, sys; d = json.load(sys.stdin); print(d["samples_per_second"], d["first_step_seconds"])'
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ratio() { "$python" -c "print('%.2f' % (float('$1') / float('$2')))"; }
tuned=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824)
below=()  # cells under --check's minimum

echo "$precision, global batch 128, Adam, threads per worker = $cores cores / workers; median of $repeats"
printf "%-5s %-3s %9s %9s %9s %7s %7s | %-19s %9s\n" model W "lockstep" "DDP" "DDP+heap" \
    "vs DDP" "vs +heap" "first step: job cold" "DDP cold"
cell() {  # model workers steps -> "lockstep DDP DDP+heap job cold DDP-cold" medians
  local ours=() plain=() heap=() job=() cold=() theirs_cold=() sps js cs fs
  for _ in $(seq "$repeats"); do
    read -r sps js cs < <(lockstep "$2" "$1" "$3")
    ours+=("$sps"); job+=("$js"); cold+=("$cs")
    if [ -z "$check_min" ]; then
      read -r sps fs < <(ddp "$2" "$1" "$3")
      plain+=("$sps"); theirs_cold+=("$fs")
    else  # the check compares with DDP + heap alone: a third fewer runs
      plain+=(nan); theirs_cold+=(nan)
    fi
    read -r sps fs < <(ddp "$2" "$1" "$3" "${tuned[@]}")
    heap+=("$sps")
  done
  local m
  for m in ours plain heap job cold theirs_cold; do
    local -n list=$m
    printf '%s ' "$(printf '%s\n' "${list[@]}" | median)"
  done
  echo
}
below_min() { "$python" -c "import sys; sys.exit(0 if $1 / $2 < $check_min else 1)"; }

for model in mlp cnn; do
  steps=400; [ "$model" = cnn ] && steps=120
  steps=${steps_override:-$steps}
  for workers in 1 2; do
    read -r a b c j k f < <(cell "$model" "$workers" "$steps")
    # A cell under --check's minimum is measured again, twice at most, and
    # fails only if every measurement is under it: single cells of this
    # shared machine have been seen 20% low for both systems' reasons, while
    # the regressions the check is for (a third of DDP's speed) stay low.
    for retry in 1 2; do
      [ -n "$check_min" ] && below_min "$a" "$c" || break
      echo "($model on $workers worker(s): $(ratio "$a" "$c"), measuring again, $retry of 2)"
      read -r a b c j k f < <(cell "$model" "$workers" "$steps")
    done
    printf "%-5s %-3s %9.0f %9.0f %9.0f %7s %7s | %9.2f %9.2f %9.2f\n" "$model" "$workers" \
        "$a" "$b" "$c" "$(ratio "$a" "$b")" "$(ratio "$a" "$c")" "$j" "$k" "$f"
    if [ -n "$check_min" ] && below_min "$a" "$c"; then
      below+=("$model on $workers worker(s): $(ratio "$a" "$c")")
    fi
  done
done
echo "environment: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-unset}; BLAS $(readlink -f /usr/lib/"$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)"/libopenblas.so.0 2>/dev/null || echo unknown)"
if [ ${#below[@]} -gt 0 ]; then
  echo "ddp_compare: lockstep / (DDP + heap) below $check_min in: ${below[*]}" >&2
  exit 1
fi
