#!/usr/bin/env bash
# A data set larger than every worker's memory trains to the end of an epoch
# (issue 26, "Memory"): the .npy files are memory-mapped, so a worker's
# resident memory does not grow with the data set.
#
#   bench/data_scale.sh BUILD_DIR [DATA_GIB] [LIMIT_MIB] [STEPS]
#
# Writes DATA_GIB (default 3) of 28x28 uint8 images (Fashion-MNIST's, tiled)
# as train_image.npy / train_label.npy, then runs a real coordinator and two
# workers, each worker in its own cgroup v1 memory cgroup limited to
# LIMIT_MIB (default 768: the data is 4x the limit), and reports:
#   - dd's cold-cache read rate of the image file (the reference);
#   - one whole epoch from a cold cache with data.shuffle "blocks": samples/s,
#     the read rate it implies, each worker's peak RSS (VmHWM), the cgroups'
#     OOM kills (must be 0), and the job's state (must be succeeded);
#   - STEPS (default 1500) steps from a cold cache with data.shuffle
#     "global" (random reads);
#   - STEPS steps with the file in the page cache and no limit, against the
#     same model on Fashion-MNIST IDX decoded into memory (the same shape),
#     interleaved twice: the ratio mapped / in memory (goal >= 0.9).
# The MLP, global batch 256, 1 thread per worker. Needs root (cgroups,
# drop_caches) and /usr/bin/python3 with numpy; exit 77 without them.
# OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are left as the environment sets them.
set -euo pipefail
BUILD=${1:?usage: bench/data_scale.sh BUILD_DIR [DATA_GIB] [LIMIT_MIB] [STEPS]}
GIB=${2:-3}
LIMIT_MIB=${3:-768}
STEPS=${4:-1500}
BIN=$(cd "$BUILD" && pwd)/bin
EXAMPLES=$(cd "$(dirname "$0")/../examples" && pwd)
CG=/sys/fs/cgroup/memory
[ "$(id -u)" = 0 ] && [ -d "$CG" ] || { echo "needs root and cgroup v1 memory"; exit 77; }
/usr/bin/python3 -c 'import numpy' 2>/dev/null || { echo "needs python3-numpy"; exit 77; }
WORK=$(mktemp -d /var/tmp/lockstep-data-scale-XXXXXX)
NAME=lockstep-data-scale-$$
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for w in 0 1; do
    # Whatever is still in the cgroup goes too, then the cgroup.
    local cg="$CG/$NAME-w$w"
    [ -d "$cg" ] || continue
    xargs -r kill -9 < "$cg/cgroup.procs" 2>/dev/null || true
    for _ in $(seq 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT

echo "writing $GIB GiB of images to $WORK/data" >&2
/usr/bin/python3 - "$WORK/data" "$GIB" <<'PY'
import gzip, os, sys
import numpy as np
out, gib = sys.argv[1], float(sys.argv[2])
os.makedirs(out, exist_ok=True)
src = "/usr/share/datasets/fashion-mnist"
def idx(name, offset):
    with gzip.open(f"{src}/{name}.gz") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)
images = idx("train-images-idx3-ubyte", 16).reshape(-1, 28, 28)
labels = idx("train-labels-idx1-ubyte", 8)
n = int(gib * (1 << 30)) // (28 * 28)
x = np.lib.format.open_memmap(f"{out}/train_image.npy", "w+", np.uint8, (n, 28, 28))
y = np.lib.format.open_memmap(f"{out}/train_label.npy", "w+", np.uint8, (n,))
for start in range(0, n, len(images)):
    k = min(len(images), n - start)
    x[start:start + k] = images[:k]
    y[start:start + k] = labels[:k]
x.flush(); y.flush(); del x, y
np.save(f"{out}/test_image.npy", idx("t10k-images-idx3-ubyte", 16).reshape(-1, 28, 28))
np.save(f"{out}/test_label.npy", idx("t10k-labels-idx1-ubyte", 8))
print(n)
PY
sync
BYTES=$(stat -c %s "$WORK/data/train_image.npy")
SAMPLES=$(( BYTES / 784 ))

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

drop_caches
DD=$(dd if="$WORK/data/train_image.npy" of=/dev/null bs=4M 2>&1 | tail -1)
DD_MBPS=$(echo "$DD" | awk -v b="$BYTES" '{for(i=1;i<=NF;i++) if ($i=="s,") t=$(i-1)} END {printf "%.0f", b/t/1e6}')

# A coordinator and two workers; worker w runs in cgroup $NAME-w$w when
# LIMITED=1.
start_cluster() {
  local limited=$1
  mkdir -p "$WORK/state"
  rm -f "$WORK/coordinator.out"
  "$BIN/lockstep-coordinator" --listen 127.0.0.1:0 --state-dir "$WORK/state" \
      --insecure > "$WORK/coordinator.out" 2> "$WORK/coordinator.err" &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q listening "$WORK/coordinator.out" 2>/dev/null && break
    sleep 0.1
  done
  ADDR=$(awk '/listening on/ {print $NF}' "$WORK/coordinator.out")
  WORKER_PIDS=()
  for w in 0 1; do
    local cg=""
    if [ "$limited" = 1 ]; then
      cg="$CG/$NAME-w$w"
      mkdir -p "$cg"
      echo $(( LIMIT_MIB << 20 )) > "$cg/memory.limit_in_bytes"
    fi
    OMP_NUM_THREADS=1 bash -c '[ -n "$1" ] && echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
      "$BIN/lockstep-worker" --coordinator "$ADDR" --insecure --threads 1 \
      --device cpu --data-root "$WORK:/usr/share/datasets" \
      > "$WORK/worker$w.out" 2> "$WORK/worker$w.err" &
    pids+=($!); WORKER_PIDS+=($!)
  done
}

stop_cluster() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
  rm -rf "$WORK/state"
}

# Runs one job (extra --set arguments) on the cluster; prints
# "samples_per_second state".
run_job() {
  "$BIN/lockstep" submit "$EXAMPLES/fashion_mnist_mlp.json" \
      --coordinator "$ADDR" --insecure --watch \
      --set num_workers=2 --set global_batch_size=256 --set log_every_steps=0 \
      "$@" > "$WORK/submit.out" 2> "$WORK/submit.err" || true
  local job
  job=$(head -1 "$WORK/submit.out")
  "$BIN/lockstep" status "$job" --coordinator "$ADDR" --insecure --json |
    /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); d=d[0] if isinstance(d, list) else d; print(round(d.get("samples_per_second", d.get("samplesPerSecond", 0))), d.get("state","").lower().replace("job_state_",""))'
}

# Samples the workers' resident memory every 0.2 s while a job runs:
# anonymous (the worker's own) and file-backed (mapped data and libraries,
# reclaimable page cache). Writes "ANON_MIB FILE_MIB" (the peaks) to $1.
sample_rss() {
  local out=$1 anon=0 file=0
  while [ ! -e "$out.stop" ]; do
    for pid in "${WORKER_PIDS[@]}"; do
      local a f
      a=$(awk '/RssAnon/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
      f=$(awk '/RssFile/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
      [ "${a:-0}" -gt "$anon" ] && anon=$a
      [ "${f:-0}" -gt "$file" ] && file=$f
    done
    echo "$(( anon / 1024 )) $(( file / 1024 ))" > "$out"
    sleep 0.2
  done
}

# Runs run_job with the sampler beside it; sets SPS STATE ANON FILE.
run_sampled() {
  rm -f "$WORK/rss" "$WORK/rss.stop"
  sample_rss "$WORK/rss" &
  local sampler=$!
  read -r SPS STATE < <(run_job "$@")
  touch "$WORK/rss.stop"
  wait "$sampler" 2>/dev/null || true
  read -r ANON FILE < "$WORK/rss"
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

NPY=(--set data.format=npy --set "data.dir=$WORK/data")

echo "one epoch of $SAMPLES samples from a cold cache, shuffle blocks, $LIMIT_MIB MiB per worker" >&2
drop_caches
start_cluster 1
START=$(date +%s.%N)
run_sampled "${NPY[@]}" --set data.shuffle=blocks --set epochs=1
END=$(date +%s.%N)
EPOCH_SPS=$SPS EPOCH_STATE=$STATE EPOCH_ANON=$ANON EPOCH_FILE=$FILE
EPOCH_OOM=$(oom_kills)
stop_cluster
EPOCH_SECONDS=$(/usr/bin/python3 -c "print(f'{$END - $START:.1f}')")
EPOCH_MBPS=$(/usr/bin/python3 -c "print(round($BYTES / $EPOCH_SECONDS / 1e6))")

echo "$STEPS steps from a cold cache, shuffle global, $LIMIT_MIB MiB per worker" >&2
drop_caches
start_cluster 1
run_sampled "${NPY[@]}" --set "max_steps=$STEPS"
GLOBAL_SPS=$SPS GLOBAL_STATE=$STATE GLOBAL_ANON=$ANON GLOBAL_FILE=$FILE
GLOBAL_OOM=$(oom_kills)
stop_cluster

echo "$STEPS steps warm and unlimited: mapped npy against IDX in memory" >&2
cat "$WORK/data/train_image.npy" > /dev/null
declare -a MAPPED=() MEMORY=()
for _ in 1 2; do
  start_cluster 0
  read -r sps _ < <(run_job "${NPY[@]}" --set "max_steps=$STEPS"); MAPPED+=("$sps")
  read -r sps _ < <(run_job --set "max_steps=$STEPS"); MEMORY+=("$sps")
  stop_cluster
done
RATIO=$(/usr/bin/python3 -c "import statistics as s, sys
m = [float(x) for x in sys.argv[1].split()]; r = [float(x) for x in sys.argv[2].split()]
print(f'{s.median(m) / s.median(r):.3f}')" "${MAPPED[*]}" "${MEMORY[*]}")

cat <<EOT
| run | data | samples/s | peak RSS anon / file (MiB, per worker) | OOM kills | state |
| --- | --- | ---: | ---: | ---: | --- |
| one epoch, cold cache, shuffle blocks, ${LIMIT_MIB} MiB cgroup | $GIB GiB npy, $SAMPLES samples | $EPOCH_SPS | $EPOCH_ANON / $EPOCH_FILE | $EPOCH_OOM | $EPOCH_STATE |
| $STEPS steps, cold cache, shuffle global, ${LIMIT_MIB} MiB cgroup | the same | $GLOBAL_SPS | $GLOBAL_ANON / $GLOBAL_FILE | $GLOBAL_OOM | $GLOBAL_STATE |
| $STEPS steps, page cache, no limit (x2) | the same, mapped | ${MAPPED[*]} | | | |
| $STEPS steps, no limit (x2) | Fashion-MNIST IDX in memory | ${MEMORY[*]} | | | |

mapped / in memory (median): $RATIO
cold epoch: $EPOCH_SECONDS s for $BYTES bytes = $EPOCH_MBPS MB/s of images; dd (cold): $DD_MBPS MB/s
EOT
echo "{\"data_bytes\": $BYTES, \"limit_mib\": $LIMIT_MIB, \"epoch_samples_per_second\": $EPOCH_SPS, \"epoch_peak_rss_anon_mib\": $EPOCH_ANON, \"epoch_peak_rss_file_mib\": $EPOCH_FILE, \"epoch_oom_kills\": $EPOCH_OOM, \"epoch_state\": \"$EPOCH_STATE\", \"global_samples_per_second\": $GLOBAL_SPS, \"mapped_over_memory\": $RATIO, \"epoch_read_mbps\": $EPOCH_MBPS, \"dd_mbps\": $DD_MBPS}"
[ "$EPOCH_STATE" = succeeded ] && [ "$EPOCH_OOM" = 0 ]
