#!/usr/bin/env bash
# Training across the network test bed's hosts, every link capped: lockstep
# (its encrypted data plane; the direct, the ring and the timed choice,
# "auto", of all-reduce, and the ring with gradients sent as bf16,
# communication.compression) against PyTorch DDP (gloo, clear text;
# bench/ddp_reference.py or, for the gpt, bench/lm_ddp.py, one rank per
# host as torchrun starts them; fp32, and fp16 on the wire through its
# fp16_compress_hook), the same model, optimizer, global batch and steps. Host 0 runs lockstep's coordinator; hosts 1..HOSTS one worker, or
# one DDP rank, each. Prints samples/s per system and lockstep / DDP
# (docs/BENCHMARKS.md, "Training on capped links").
#
#   bench/netbed_train.sh BUILD_DIR RATE HOSTS [MODEL] [STEPS] [REPEATS]
#   e.g. bench/netbed_train.sh build 200mbit 2 mlp 200 3
#
# MODEL is mlp, cnn or gpt (default mlp; gpt: examples/char_lm_fortunes.json
# against bench/lm_ddp.py, global batch 64 windows of 64 characters of
# Debian's fortunes, made into tokens in the run's folder; its samples are
# windows), STEPS the steps of every run (default
# 200), REPEATS the runs of each system, interleaved (default 1; the table
# gives their median). Threads per process: cores / HOSTS. The control
# plane runs without TLS (--insecure): its traffic is a few messages a
# step; the data plane stays encrypted, as by default.
#
# KEEP=1 keeps the runs' logs (their folder is named on a failure).
# Needs root (network namespaces) and Debian's python3-torch; exits 77
# without them.
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR RATE HOSTS [MODEL] [STEPS] [REPEATS]}
rate=${2:?rate, e.g. 200mbit}
hosts=${3:?hosts, 2 or more}
model=${4:-mlp}
steps=${5:-200}
repeats=${6:-1}
python=/usr/bin/python3
if [[ $EUID -ne 0 ]]; then
  echo "netbed_train: the network test bed needs root; skipped" >&2
  exit 77
fi
"$python" -c 'import torch' 2>/dev/null || {
  echo "netbed_train: needs Debian's python3-torch; skipped" >&2
  exit 77
}
case "$model" in mlp|cnn|gpt) ;; *) echo "netbed_train: MODEL is mlp, cnn or gpt" >&2; exit 2 ;; esac
if [[ $model == gpt ]] && ! compgen -G "/usr/share/games/fortunes/*" >/dev/null; then
  echo "netbed_train: gpt needs Debian's fortunes (apt-get install fortunes); skipped" >&2
  exit 77
fi
[[ $hosts -ge 2 ]] || { echo "netbed_train: HOSTS must be 2 or more" >&2; exit 2; }
build=$(cd "$build" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source "$here/tests/netbed/netbed.sh"
bed=lsnbtr
netbed_down "$bed" >/dev/null 2>&1 || true
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  netbed_down "$bed" >/dev/null 2>&1 || true
  [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
global=128
if [[ $model == gpt ]]; then
  global=64
  "$python" scripts/text-to-tokens "$work/fortunes" /usr/share/games/fortunes/* >/dev/null 2>&1 ||
    { echo "netbed_train: scripts/text-to-tokens failed" >&2; exit 1; }
fi
netbed_up "$bed" $((hosts + 1))
netbed_cap_all "$bed" "$rate"
threads=$(( $(nproc) / hosts > 0 ? $(nproc) / hosts : 1 ))
coordinator=$(netbed_addr "$bed" 0):7070
master=$(netbed_addr "$bed" 1)
export LOCKSTEP_COORDINATOR=$coordinator LOCKSTEP_INSECURE=1
# In a subshell of its own: netbed_exec execs when called from a subshell
# (a $(...) of this script), which would end the caller.
cli() { (netbed_exec "$bed" 0 "$build/bin/lockstep" "$@"); }

lockstep_run() {  # ALGORITHM RUN [COMPRESSION] -> "samples/s algorithm-run"
  local dir=$work/lockstep-$1-$2-${3:-none} i
  mkdir -p "$dir"
  pids=()
  (netbed_exec "$bed" 0 "$build/bin/lockstep-coordinator" --listen "$coordinator" \
     --state-dir "$dir/state" --insecure >"$dir/coordinator.log" 2>&1) &
  pids+=($!)
  for ((i = 1; i <= hosts; i++)); do
    (netbed_exec "$bed" "$i" env OMP_NUM_THREADS="$threads" "$build/bin/lockstep-worker" \
       --coordinator "$coordinator" --insecure --host "$(netbed_addr "$bed" "$i")" \
       --threads "$threads" >"$dir/worker-$i.log" 2>&1) &
    pids+=($!)
  done
  for i in $(seq 300); do  # the coordinator answers: up to 30 s
    cli status >/dev/null 2>&1 && break
    sleep 0.1
  done
  local job spec=(examples/fashion_mnist_mlp.json --set model="$model"
                   --set optimizer.type=adam)
  # The gpt as bench/lm_compare.sh runs it (and lm_ddp.py's defaults).
  [[ $model == gpt ]] && spec=(examples/char_lm_fortunes.json --set data.dir="$work/fortunes"
                               --set epochs=1000 --set log_every_steps=1000000)
  job=$(cli submit "${spec[@]}" --json \
          --set num_workers="$hosts" --set max_steps="$steps" \
          --set global_batch_size="$global" \
          --set communication.algorithm="$1" \
          --set communication.compression="${3:-none}" |
        "$python" -c 'import json, sys; print(json.load(sys.stdin)["job_id"])')
  cli watch "$job" >"$dir/watch.log" 2>&1 || {
    echo "netbed_train: lockstep's job failed; $dir/watch.log (KEEP=1 keeps it):" >&2
    tail -n 5 "$dir/watch.log" >&2
    return 1
  }
  cli status "$job" --json |
    "$python" -c 'import json, sys; d = json.load(sys.stdin); d = d[0] if isinstance(d, list) else d; p = d.get("plan", {}); print(d.get("samples_per_second", d.get("samplesPerSecond")), p.get("all_reduce_algorithm", p.get("allReduceAlgorithm", "-")))'
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}

ddp_run() {  # RUN [COMPRESS] -> samples/s (rank 0's)
  local dir=$work/ddp-$1-${2:-none} i
  mkdir -p "$dir"
  pids=()
  for ((i = 1; i <= hosts; i++)); do
    # The allocator as the lockstep worker sets it (ddp_compare.sh's
    # "DDP + heap"); gloo on the host's own interface.
    local program=(bench/ddp_reference.py --model "$model")
    [[ $model == gpt ]] && program=(bench/lm_ddp.py --data "$work/fortunes")
    (netbed_exec "$bed" "$i" env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS="$threads" \
       MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 \
       timeout 600 "$python" "${program[@]}" --workers "$hosts" --rank $((i - 1)) \
       --master "$master" --steps "$steps" --global-batch "$global" \
       --threads "$threads" --compress "${2:-none}" \
       >"$dir/rank-$i.out" 2>"$dir/rank-$i.err") &
    pids+=($!)
  done
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  pids=()
  if [[ $failed -ne 0 ]]; then
    echo "netbed_train: a DDP rank failed; $dir/rank-1.err:" >&2
    tail -n 5 "$dir/rank-1.err" >&2
    return 1
  fi
  tail -n 1 "$dir/rank-1.out" |
    "$python" -c 'import json, sys; d = json.load(sys.stdin); print(d["samples_per_second"] if "samples_per_second" in d else d["tokens_per_second"] / 64)'
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
direct=() ring=() auto=() chosen=() ring16=() ddp=() ddp16=()
for ((r = 1; r <= repeats; r++)); do
  direct+=("$(lockstep_run direct "$r" | cut -d' ' -f1)")
  ring+=("$(lockstep_run ring "$r" | cut -d' ' -f1)")
  read -r sps algorithm < <(lockstep_run auto "$r")
  auto+=("$sps") chosen+=("$algorithm")
  ring16+=("$(lockstep_run ring "$r" bf16 | cut -d' ' -f1)")
  ddp+=("$(ddp_run "$r")")
  ddp16+=("$(ddp_run "$r" fp16)")
done
d=$(printf '%s\n' "${direct[@]}" | median)
g=$(printf '%s\n' "${ring[@]}" | median)
a=$(printf '%s\n' "${auto[@]}" | median)
b=$(printf '%s\n' "${ring16[@]}" | median)
p=$(printf '%s\n' "${ddp[@]}" | median)
h=$(printf '%s\n' "${ddp16[@]}" | median)
echo "$model, $hosts hosts, links capped at $rate, global batch $global, $steps steps," \
     "$threads thread(s) per process; samples/s, median of $repeats"
printf '%-16s %10s %10s %10s %10s %12s %12s %12s\n' "" "lockstep" "lockstep" "lockstep" "DDP" \
    "direct/DDP" "ring/DDP" "auto/DDP"
printf '%-16s %10s %10s %10s %10s\n' "" "direct" "ring" "auto" "(gloo)"
printf '%-16s %10.0f %10.0f %10.0f %10.0f %12.2f %12.2f %12.2f\n' "$model x$hosts $rate" \
    "$d" "$g" "$a" "$p" "$("$python" -c "print($d / $p)")" \
    "$("$python" -c "print($g / $p)")" "$("$python" -c "print($a / $p)")"
echo "16-bit wire: lockstep ring + bf16 $(printf %.0f "$b"), DDP + fp16 hook" \
     "$(printf %.0f "$h"): ring-bf16/DDP-fp16 $("$python" -c "print(round($b / $h, 2))")," \
     "ring-bf16/DDP $("$python" -c "print(round($b / $p, 2))")"
echo "runs: direct ${direct[*]}; ring ${ring[*]}; auto ${auto[*]} (chose ${chosen[*]});" \
     "ring-bf16 ${ring16[*]}; DDP ${ddp[*]}; DDP-fp16 ${ddp16[*]}"
