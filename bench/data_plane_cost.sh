#!/usr/bin/env bash
# What the data plane's transport costs training: `lockstep local` on 2
# workers with the CPU collectives over
#   gloo   Gloo's TCP pairs (--data-plane-transport gloo: the transport before
#          lockstep's own, unauthenticated and unencrypted),
#   clear  lockstep's transport, authenticated, --data-plane-encryption off,
#   aes    lockstep's transport encrypted with AES-256-GCM (the default),
# alternating in one invocation so all see the same machine. Two workloads:
# the CNN on Fashion-MNIST (samples/s) and the character gpt of
# examples/char_lm_fortunes.json (4 layers, width 128: tokens/s). Reports
# the median of REPEATS runs per cell and the ratios to gloo, and fails when
# the three transports end a workload with different model digests (they
# must sum the same bits).
#
#   bench/data_plane_cost.sh [BUILD_DIR] [REPEATS] [CNN_STEPS] [LM_STEPS]
#   DATA_PLANE_COST_WORKLOADS=cnn bench/data_plane_cost.sh BUILD_DIR 1 3
#                                   a smoke run (the CNN only: the LM's
#                                   evaluation of 257k tokens takes ~10 s)
# BENCH_DATA_DIR, when set, is the CNN's data.dir (the smoke runs point it at
# bench/tiny_dataset.sh's output). The LM's tokens are made from
# /usr/share/games/fortunes into BUILD_DIR/data/fortunes when missing.
set -euo pipefail
build=${1:-build}
repeats=${2:-3}
cnn_steps=${3:-120}
lm_steps=${4:-60}
cnn_data=(${BENCH_DATA_DIR:+--set "data.dir=$BENCH_DATA_DIR"})
lm_data=$build/data/fortunes
workloads=${DATA_PLANE_COST_WORKLOADS:-cnn lm}
python=/usr/bin/python3
if [[ " $workloads " == *" lm "* && ! -f "$lm_data/train.bin" ]]; then
  compgen -G "/usr/share/games/fortunes/*" >/dev/null || {
    echo "data_plane_cost: no /usr/share/games/fortunes (apt-get install fortunes)" >&2
    exit 1
  }
  "$python" scripts/text-to-tokens "$lm_data" /usr/share/games/fortunes/* >&2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=$tmp/results

run() {  # workload mode -> appends "workload mode rate digest"
  local flags=()
  case $2 in
    gloo) flags=(--insecure --data-plane-transport gloo --data-plane-encryption off) ;;
    clear) flags=(--data-plane-encryption off) ;;
    aes) flags=() ;;
  esac
  local job=()
  if [ "$1" = cnn ]; then
    job=(--set max_steps="$cnn_steps" --set global_batch_size=128
         "${cnn_data[@]}" examples/fashion_mnist_cnn.json)
  else
    job=(--set data.dir="$lm_data" --set data.block_size=64
         --set global_batch_size=64 --set max_steps="$lm_steps" --set epochs=1000
         --set model.n_layer=4 --set model.n_head=4 --set model.n_embd=128
         --set log_every_steps=1000000 examples/char_lm_fortunes.json)
  fi
  if ! timeout -k 10 600 "$build/bin/lockstep" local --workers 2 --json "${flags[@]}" \
      "${job[@]}" >"$tmp/out" 2>"$tmp/err"; then
    echo "data_plane_cost: the $1 run over $2 failed:" >&2
    tail -n 20 "$tmp/err" >&2
    exit 1
  fi
  tail -n 1 "$tmp/out" | "$python" -c '
import json, sys
d = json.load(sys.stdin)
rate = d.get("tokens_per_second") or d["samples_per_second"]
print(sys.argv[1], sys.argv[2], rate, d["model_digest"])' "$1" "$2" >>"$results"
}

for _ in $(seq "$repeats"); do
  for workload in $workloads; do
    for mode in gloo clear aes; do run "$workload" "$mode"; done
  done
done

"$python" - "$results" "$repeats" "$cnn_steps" "$lm_steps" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
print("2 workers (lockstep local, threads = cores / 2), median of %s runs, the "
      "transports alternating; CNN %s steps (samples/s), LM %s steps "
      "(tokens/s)" % (sys.argv[2], sys.argv[3], sys.argv[4]))
print("%-8s %12s %12s %12s %10s %10s %10s" % ("", "gloo", "clear", "aes",
      "clear/gloo", "aes/gloo", "aes/clear"))
bad = False
for workload in ("cnn", "lm"):
    if not any(r[0] == workload for r in rows):
        continue
    m = {mode: statistics.median(float(r[2]) for r in rows
                                 if r[0] == workload and r[1] == mode)
         for mode in ("gloo", "clear", "aes")}
    print("%-8s %12.0f %12.0f %12.0f %10.3f %10.3f %10.3f" % (
        workload, m["gloo"], m["clear"], m["aes"], m["clear"] / m["gloo"],
        m["aes"] / m["gloo"], m["aes"] / m["clear"]))
    digests = {r[3] for r in rows if r[0] == workload}
    if len(digests) != 1:
        print("data_plane_cost: %s ended with different digests: %s"
              % (workload, sorted(digests)), file=sys.stderr)
        bad = True
    else:
        print("         model_digest %s in every run" % digests.pop()[:16])
sys.exit(1 if bad else 0)
EOF
