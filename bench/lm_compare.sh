#!/usr/bin/env bash
# lockstep's built-in gpt against the same model in plain PyTorch trained with
# DistributedDataParallel (bench/lm_ddp.py; Debian's python3-torch, gloo,
# 127.0.0.1, CPU), in one invocation: 4 layers, 4 heads, n_embd 128, block 64,
# global batch 64, AdamW (weight decay 0.1 on the blocks' matrices, betas
# 0.9/0.99), lr 1e-3 cosine to 1e-4 over the run, gradient clipping at 1, no
# dropout, seed 1, on the character tokens of the fortunes
# (scripts/text-to-tokens). lm_ddp.py builds the model in lockstep's order
# from the same seed and reads the windows in lockstep's permutation, so both
# sides train the same weights on the same batches: their losses agree to
# rounding, and any gap in validation loss is a difference in the arithmetic.
#
# Each row is W workers x THREADS threads (default 1; LM_COMPARE_THREADS),
# the systems interleaved (lockstep, DDP, lockstep, DDP, ...), the median of
# REPEATS runs of STEPS steps each. Tokens/s: lockstep's is its own
# (every step, evaluation excluded); DDP's is after lm_ddp.py's 10 warm-up
# steps (bench/ddp_reference.py's rule). Validation loss: mean cross-entropy
# over every token of every val.bin window, after the last step.
#
# Both sides get what `lockstep local` gives its workers: OMP_NUM_THREADS and
# OPENBLAS_NUM_THREADS = THREADS (OMP_WAIT_POLICY=PASSIVE when W x THREADS
# exceeds the cores), and DDP runs with glibc's allocator told what the
# lockstep worker tells it (MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_,
# worker/compute_setup.cc), as bench/ddp_compare.sh's "DDP+heap" column.
# LM_COMPARE_PLAIN_DDP=1 adds a column of DDP without those settings.
# LM_COMPARE_PRECISION=bf16 trains both in bf16: lockstep's precision
# "bf16", DDP's forward pass and loss under torch.autocast("cpu",
# torch.bfloat16) as nanoGPT writes it.
#
# LM_COMPARE_BLOCK: the sequence length (default 64); LM_COMPARE_GLOBAL: the
# global batch (default 64). LM_COMPARE_FUSED=false runs lockstep's gpt
# with model.fused false (LibTorch's unfused attention, as DDP's model).
# Each side's peak memory: the largest resident set of any of its
# processes (getrusage's maxrss of the children: a worker, in practice),
# the median over the repeats.
#
# Data: LM_COMPARE_DATA (a directory with train.bin and val.bin, uint16),
# default BUILD_DIR/data/fortunes, made from /usr/share/games/fortunes when
# missing. LM_COMPARE_WORKERS: the rows' worker counts (default "2"; e.g.
# "1 2").
#
# Without python3-torch (or without the data and the fortunes to make it)
# it exits 77. The last line of stdout is one JSON object with every row.
#
# --check MIN: exit 1 when lockstep / DDP tokens/s is below MIN in any row,
# or the validation losses differ by more than LM_COMPARE_LOSS_TOL
# (relative, default 0.02).
#
#   bench/lm_compare.sh [BUILD_DIR] [REPEATS] [STEPS] [--check MIN]
#   bench/lm_compare.sh build 3 default      the benchmark: 120 steps (about 3-6 min on 2 cores)
#   bench/lm_compare.sh build 1 20           a smoke run (under a minute)
set -euo pipefail
build=${1:-build}
repeats=${2:-3}
steps=${3:-120}
[ "$steps" = default ] && steps=120
check_min=""
if [ "${4:-}" = --check ]; then
  check_min=${5:?--check needs the lowest ratio allowed, e.g. 1.2}
fi
threads=${LM_COMPARE_THREADS:-1}
workers_list=${LM_COMPARE_WORKERS:-2}
loss_tol=${LM_COMPARE_LOSS_TOL:-0.02}
precision=${LM_COMPARE_PRECISION:-fp32}
data=${LM_COMPARE_DATA:-$build/data/fortunes}
cores=$(nproc)
python=/usr/bin/python3
start_time=$(date +%s.%N)
"$python" -c 'import torch' 2>/dev/null || {
  echo "lm_compare: needs Debian's python3-torch (apt-get install python3-torch)" >&2
  exit 77
}
if [ ! -f "$data/train.bin" ] || [ ! -f "$data/val.bin" ]; then
  if ! compgen -G "/usr/share/games/fortunes/*" >/dev/null; then
    echo "lm_compare: no $data/train.bin and no /usr/share/games/fortunes to make it from" \
         "(apt-get install fortunes, or set LM_COMPARE_DATA)" >&2
    exit 77
  fi
  "$python" scripts/text-to-tokens "$data" /usr/share/games/fortunes/* >&2
fi

# Windows of block + 1 tokens every block tokens (lockstep's count), so that
# `epochs` covers STEPS: lockstep stops at min(epochs x steps/epoch, max_steps).
block=${LM_COMPARE_BLOCK:-64} global=${LM_COMPARE_GLOBAL:-64}
fused=${LM_COMPARE_FUSED:-true}
tokens=$(( $(stat -c %s "$data/train.bin") / 2 ))
per_epoch=$(( ((tokens - block - 1) / block + 1) / global ))
[ "$per_epoch" -ge 1 ] || { echo "lm_compare: $data/train.bin is too small" >&2; exit 1; }
epochs=$(( (steps + per_epoch - 1) / per_epoch ))

# A run that hangs fails the benchmark instead of holding it: 3 s a step of
# 64 x 64 tokens, in proportion to the step's tokens (the unfused attention
# grows with their square: LM_COMPARE_TIMEOUT, in seconds, overrides).
limit=${LM_COMPARE_TIMEOUT:-$(( 120 + 3 * steps * block * global / 4096 ))}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=29541

# Same-for-both environment: what `lockstep local` gives each worker.
thread_env() {  # workers
  local env=(OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads")
  (( $1 * threads > cores )) && env+=(OMP_WAIT_POLICY=PASSIVE)
  echo "${env[@]}"
}
heap=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824)
# Runs a command; writes the largest maxrss (KiB) of its processes to $tmp/rss.
peak() {
  "$python" -c 'import resource, subprocess, sys
code = subprocess.run(sys.argv[2:]).returncode
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)' "$tmp/rss" "$@"
}

lockstep() {  # workers -> "tokens/s val_loss final_loss peak_mib"
  local out=$tmp/lockstep.json
  # shellcheck disable=SC2046
  if ! peak timeout -k 10 "$limit" env $(thread_env "$1") "$build/bin/lockstep" local --workers "$1" --threads "$threads" --json \
      --set data.dir="$data" --set data.block_size=$block \
      --set global_batch_size=$global --set max_steps="$steps" --set epochs="$epochs" \
      --set model.n_layer=4 --set model.n_head=4 --set model.n_embd=128 --set model.dropout=0 \
      --set optimizer.type=adamw --set optimizer.weight_decay=0.1 \
      --set optimizer.beta1=0.9 --set optimizer.beta2=0.99 \
      --set base_lr=0.001 --set min_lr=0.0001 --set lr_decay=cosine --set warmup_steps=0 \
      --set clip_grad_norm=1 --set seed=1 --set log_every_steps=1000000 \
      --set precision="$precision" --set model.fused="$fused" \
      examples/char_lm_fortunes.json >"$tmp/lockstep.out" 2>"$tmp/lockstep.err"; then
    echo "lm_compare: lockstep on $1 worker(s) failed:" >&2; tail -n 20 "$tmp/lockstep.err" >&2
    return 1
  fi
  tail -n 1 "$tmp/lockstep.out" >"$out"
  "$python" -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert d["state"] == "succeeded" and d["steps"] == int(sys.argv[2]), d
print(d["tokens_per_second"], d["test_loss"], d["final_loss"], int(open(sys.argv[3]).read()) / 1024)' \
    "$out" "$steps" "$tmp/rss"
}
ddp() {  # workers [env...] -> "tokens/s val_loss final_loss peak_mib"
  port=$(( port + 1 ))
  # shellcheck disable=SC2046
  if ! peak timeout -k 10 "$limit" env $(thread_env "$1") "${@:2}" "$python" bench/lm_ddp.py --workers "$1" \
      --threads "$threads" --data "$data" --steps "$steps" --global-batch $global \
      --block $block --n-layer 4 --n-head 4 --n-embd 128 --dropout 0 \
      --lr 0.001 --min-lr 0.0001 --lr-decay cosine --warmup-steps 0 \
      --weight-decay 0.1 --beta1 0.9 --beta2 0.99 --clip 1 --seed 1 --port "$port" \
      --precision "$precision" \
      >"$tmp/ddp.out" 2>"$tmp/ddp.err"; then
    echo "lm_compare: DDP on $1 worker(s) failed:" >&2; tail -n 20 "$tmp/ddp.err" >&2
    return 1
  fi
  tail -n 1 "$tmp/ddp.out" | "$python" -c 'import json, sys
d = json.load(sys.stdin)
print(d["tokens_per_second"] or d["tokens_per_second_all_steps"], d["val_loss"], d["final_loss"],
      int(open(sys.argv[1]).read()) / 1024)' "$tmp/rss"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
calc() { "$python" -c "print($1)"; }

plain=${LM_COMPARE_PLAIN_DDP:-0}
echo "$precision, gpt 4 layers x 4 heads x 128 (lockstep's model.fused $fused), block $block, global batch $global, $steps steps, AdamW, cosine lr;" \
     "$threads thread(s) per worker on $cores cores; median of $repeats, interleaved"
echo
if [ "$plain" = 1 ]; then
  echo "| W | lockstep tok/s | DDP+heap tok/s | DDP tok/s | lockstep / DDP+heap | lockstep / DDP | lockstep val loss | DDP val loss | val loss diff |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
else
  echo "| W | lockstep tok/s | DDP tok/s | lockstep / DDP | lockstep val loss | DDP val loss | val loss diff | lockstep peak MiB | DDP peak MiB | peak ratio |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
fi
rows=() failed=()
for workers in $workers_list; do
  : >"$tmp/ours" ; : >"$tmp/theirs" ; : >"$tmp/plain"
  for _ in $(seq "$repeats"); do
    lockstep "$workers" >>"$tmp/ours"
    ddp "$workers" "${heap[@]}" >>"$tmp/theirs"
    if [ "$plain" = 1 ]; then ddp "$workers" >>"$tmp/plain"; fi
  done
  a=$(cut -d' ' -f1 "$tmp/ours" | median)
  b=$(cut -d' ' -f1 "$tmp/theirs" | median)
  la=$(cut -d' ' -f2 "$tmp/ours" | median)
  lb=$(cut -d' ' -f2 "$tmp/theirs" | median)
  fa=$(cut -d' ' -f3 "$tmp/ours" | median)
  fb=$(cut -d' ' -f3 "$tmp/theirs" | median)
  ma=$(cut -d' ' -f4 "$tmp/ours" | median)
  mb=$(cut -d' ' -f4 "$tmp/theirs" | median)
  mr=$(calc "'%.2f' % ($ma / $mb)")
  r=$(calc "'%.2f' % ($a / $b)")
  diff=$(calc "'%.4f' % (abs($la - $lb) / $lb)")
  c=null rc=null
  if [ "$plain" = 1 ]; then
    c=$(cut -d' ' -f1 "$tmp/plain" | median)
    rc=$(calc "'%.2f' % ($a / $c)")
    printf "| %s | %.0f | %.0f | %.0f | %s | %s | %.4f | %.4f | %.2f%% |\n" "$workers" "$a" "$b" "$c" \
        "$r" "$rc" "$la" "$lb" "$(calc "100 * $diff")"
  else
    printf "| %s | %.0f | %.0f | %s | %.4f | %.4f | %.2f%% | %.0f | %.0f | %s |\n" "$workers" "$a" "$b" "$r" \
        "$la" "$lb" "$(calc "100 * $diff")" "$ma" "$mb" "$mr"
  fi
  rows+=("{\"workers\": $workers, \"threads\": $threads, \"lockstep_tokens_per_second\": $a, \"ddp_tokens_per_second\": $b, \"ddp_plain_tokens_per_second\": $c, \"ratio\": $r, \"ratio_plain\": $rc, \"lockstep_val_loss\": $la, \"ddp_val_loss\": $lb, \"val_loss_rel_diff\": $diff, \"lockstep_final_loss\": $fa, \"ddp_final_loss\": $fb, \"lockstep_peak_mib\": $ma, \"ddp_peak_mib\": $mb, \"peak_ratio\": $mr, \"lockstep_runs\": \"$(cut -d' ' -f1 "$tmp/ours" | tr '\n' ' ' | sed 's/ $//')\", \"ddp_runs\": \"$(cut -d' ' -f1 "$tmp/theirs" | tr '\n' ' ' | sed 's/ $//')\"}")
  if [ -n "$check_min" ]; then
    "$python" -c "import sys; sys.exit(0 if $a / $b < $check_min else 1)" &&
      failed+=("tokens/s ratio $r < $check_min on $workers worker(s)")
    "$python" -c "import sys; sys.exit(0 if $diff > $loss_tol else 1)" &&
      failed+=("val loss differs by $diff > $loss_tol on $workers worker(s)")
  fi
done
wall=$(calc "'%.1f' % ($(date +%s.%N) - $start_time)")
echo
echo "environment: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; BLAS $(readlink -f /usr/lib/"$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)"/libopenblas.so.0 2>/dev/null || echo unknown); load average $(cut -d' ' -f1-3 /proc/loadavg); wall ${wall} s"
joined=$(IFS=,; echo "${rows[*]}")
echo "{\"benchmark\": \"lm_compare\", \"precision\": \"$precision\", \"block\": $block, \"global_batch\": $global, \"fused\": $fused, \"steps\": $steps, \"repeats\": $repeats, \"threads\": $threads, \"cores\": $cores, \"wall_seconds\": $wall, \"check\": ${check_min:-null}, \"passed\": $([ ${#failed[@]} -eq 0 ] && echo true || echo false), \"rows\": [$joined]}"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'lm_compare: %s\n' "${failed[@]}" >&2
  exit 1
fi
