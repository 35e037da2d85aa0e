#!/usr/bin/env bash
# A token file of any number of windows trains with the default global
# shuffle while each worker is held to a memory cgroup (issue 34): the
# shuffle is a Feistel permutation computed position by position, so a
# worker's own memory does not depend on the data set's size.
#
#   bench/token_scale.sh BUILD_DIR [WINDOWS_M] [LIMIT_MIB] [STEPS] [STRIDE]
#
# Writes two uint16 token files, of WINDOWS_M (default 100) million windows
# and of a tenth of that (data.block_size 64, data.window_stride STRIDE,
# default 1: a window starts at every token), and trains a small gpt on each
# with a real coordinator and two workers (one thread each), each worker in
# its own cgroup v1 memory cgroup of LIMIT_MIB (default 1024), STEPS steps
# (default 200), the default data.shuffle ("global"). Reports per run and
# worker: the anonymous memory the worker logged before its first step and
# at the end, the cgroups' OOM kills (must be 0), the job's state (must be
# succeeded), and what a table of the permutation (8 bytes per window, the
# shuffle before) would have needed. Needs root and cgroup v1 memory;
# exit 77 without them. OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are left as the
# environment sets them.
set -euo pipefail
BUILD=${1:?usage: bench/token_scale.sh BUILD_DIR [WINDOWS_M] [LIMIT_MIB] [STEPS] [STRIDE]}
WINDOWS_M=${2:-100}
LIMIT_MIB=${3:-1024}
STEPS=${4:-200}
STRIDE=${5:-1}
BIN=$(cd "$BUILD" && pwd)/bin
EXAMPLES=$(cd "$(dirname "$0")/../examples" && pwd)
CG=/sys/fs/cgroup/memory
[ "$(id -u)" = 0 ] && [ -d "$CG" ] || { echo "needs root and cgroup v1 memory"; exit 77; }
WORK=$(mktemp -d /var/tmp/lockstep-token-scale-XXXXXX)
NAME=lockstep-token-scale-$$
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for w in 0 1; do
    local cg="$CG/$NAME-w$w"
    [ -d "$cg" ] || continue
    xargs -r kill -9 < "$cg/cgroup.procs" 2>/dev/null || true
    for _ in $(seq 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# write_tokens DIR WINDOWS: train.bin with WINDOWS windows of 65 tokens at
# STRIDE, ids below 64 in a pattern a model can learn; a small val.bin.
write_tokens() {
  mkdir -p "$1"
  /usr/bin/python3 - "$1" "$2" "$STRIDE" <<'PY'
import sys
import numpy as np
out, windows, stride = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tokens = (windows - 1) * stride + 65
i = np.arange(1 << 20)
pattern = ((i * 7 + i // 13) % 61).astype("<u2").tobytes()
with open(f"{out}/train.bin", "wb") as f:
    left = tokens * 2
    while left > 0:
        n = min(left, len(pattern))
        f.write(pattern[:n])
        left -= n
with open(f"{out}/val.bin", "wb") as f:
    f.write(pattern[:8192])
PY
}

start_cluster() {
  mkdir -p "$WORK/state"
  "$BIN/lockstep-coordinator" --listen 127.0.0.1:0 --state-dir "$WORK/state" \
      --insecure > "$WORK/coordinator.out" 2> "$WORK/coordinator.err" &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q listening "$WORK/coordinator.out" 2>/dev/null && break
    sleep 0.1
  done
  ADDR=$(awk '/listening on/ {print $NF}' "$WORK/coordinator.out")
  for w in 0 1; do
    local cg="$CG/$NAME-w$w"
    mkdir -p "$cg"
    echo $(( LIMIT_MIB << 20 )) > "$cg/memory.limit_in_bytes"
    OMP_NUM_THREADS=1 bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
      "$BIN/lockstep-worker" --coordinator "$ADDR" --insecure --threads 1 \
      --device cpu --data-root "$WORK" \
      > "$WORK/worker$w.out" 2> "$WORK/worker$w.err" &
    pids+=($!)
  done
}

stop_cluster() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
  for w in 0 1; do
    local cg="$CG/$NAME-w$w"
    [ -d "$cg" ] || continue
    for _ in $(seq 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
  done
  rm -rf "$WORK/state"
}

oom_kills() {
  local n=0
  for w in 0 1; do
    local k
    k=$(awk '/oom_kill / {print $2}' "$CG/$NAME-w$w/memory.oom_control" 2>/dev/null || echo 0)
    n=$(( n + ${k:-0} ))
  done
  echo "$n"
}

# run DIR: one job; prints "state oom before0/end0 before1/end1 seconds".
run() {
  start_cluster
  local start end job state
  start=$(date +%s.%N)
  "$BIN/lockstep" submit "$EXAMPLES/fashion_mnist_mlp.json" \
      --coordinator "$ADDR" --insecure --watch \
      --set task.type=language_model --set model.name=gpt \
      --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32 \
      --set data.format=tokens --set "data.dir=$1" --set data.block_size=64 \
      --set "data.window_stride=$STRIDE" --set optimizer.type=adamw \
      --set base_lr=0.003 --set global_batch_size=64 --set num_workers=2 \
      --set "max_steps=$STEPS" --set log_every_steps=0 \
      > "$WORK/submit.out" 2> "$WORK/submit.err" || true
  end=$(date +%s.%N)
  job=$(head -1 "$WORK/submit.out")
  state=$("$BIN/lockstep" status "$job" --coordinator "$ADDR" --insecure --json |
    /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); d=d[0] if isinstance(d, list) else d; print(d.get("state","").lower().replace("job_state_",""))')
  local oom memory=()
  oom=$(oom_kills)
  for w in 0 1; do
    memory+=("$(grep -o 'anonymous memory [0-9]* MiB' "$WORK/worker$w.err" |
      awk '{print $3}' | paste -sd/)")
  done
  stop_cluster
  echo "$state $oom ${memory[0]} ${memory[1]} $(/usr/bin/python3 -c "print(f'{$end - $start:.1f}')")"
}

SMALL=$(( WINDOWS_M * 100000 ))
LARGE=$(( WINDOWS_M * 1000000 ))
echo "| windows | train.bin | permutation table (before) | worker 0 anon MiB: before first step / end | worker 1 | OOM kills | state | wall s |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"
ok=1
for windows in $SMALL $LARGE; do
  echo "writing $windows windows (stride $STRIDE)" >&2
  write_tokens "$WORK/data-$windows" "$windows"
  bytes=$(stat -c %s "$WORK/data-$windows/train.bin")
  read -r state oom m0 m1 seconds < <(run "$WORK/data-$windows")
  echo "| $windows | $(( bytes >> 20 )) MiB | $(( windows * 8 >> 20 )) MiB | $m0 | $m1 | $oom | $state | $seconds |"
  [ "$state" = succeeded ] && [ "$oom" = 0 ] || ok=0
  rm -rf "$WORK/data-$windows"
done
echo "limit ${LIMIT_MIB} MiB per worker, $STEPS steps, block 64, stride $STRIDE," \
     "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
[ "$ok" = 1 ]
