#!/usr/bin/env bash
# What the worker's BLAS kernel choice (issue 38, common/blas_kernel.h) is
# worth, in one invocation on this machine:
#
#  1. The CPU, its widest vector level, and the kernel OpenBLAS picks for it
#     by itself (OPENBLAS_CORETYPE unset).
#  2. LibTorch's matrix product (Debian's python3-torch, the same OpenBLAS),
#     2048 x 2048, fp32 and bf16, on 1 and 2 threads, for each kernel set:
#     Prescott (what OpenBLAS 0.3.21 falls back to on a CPU it does not
#     know), Haswell, SkylakeX, Cooperlake where the CPU has them, and
#     OpenBLAS' own pick. GFLOP/s, median of REPEATS.
#  3. Training with `lockstep local`, 2 workers x 1 thread, global batch 64,
#     each built-in model in fp32 and bf16, before and after:
#       before  OPENBLAS_CORETYPE=Prescott: the fallback a worker ran on
#               such a CPU before it chose its own kernel;
#       after   OPENBLAS_CORETYPE unset and the failure point
#               blas_kernel_fallback, which makes each worker take
#               OpenBLAS' pick for Prescott: the worker then starts itself
#               again with the best kernel its CPU has, exactly as on a CPU
#               OpenBLAS does not know.
#     Samples/s (tokens/s for the gpt), interleaved, median of REPEATS, and
#     the ratio after / before.
#
#   bench/blas_kernel.sh [BUILD_DIR] [REPEATS] [SCALE]
#   bench/blas_kernel.sh build 3 1        the benchmark (about 15 min on 2 cores)
#   bench/blas_kernel.sh build 1 0.1      a smoke run
# SCALE multiplies each model's step count (mlp 600, cnn 150, resnet 40,
# gpt 60). BLAS_KERNEL_MODELS and BLAS_KERNEL_PRECISIONS choose the rows
# (default "mlp cnn resnet gpt" and "fp32 bf16"), BLAS_KERNEL_GEMM_SIZE the
# matrices (2048); BENCH_DATA_DIR, when set, is the data.dir of the
# Fashion-MNIST models (the smoke run's tiny copy). The gpt trains on the fortunes' characters (scripts/
# text-to-tokens into BUILD_DIR/data/fortunes, made when missing); without
# them its rows are skipped. OPENBLAS_L2_SIZE is left as the environment
# sets it, and printed.
set -euo pipefail
build=${1:-build}
repeats=${2:-3}
scale=${3:-1}
models=${BLAS_KERNEL_MODELS:-mlp cnn resnet gpt}
precisions=${BLAS_KERNEL_PRECISIONS:-fp32 bf16}
gemm_size=${BLAS_KERNEL_GEMM_SIZE:-2048}
python=/usr/bin/python3
lockstep=$build/bin/lockstep
[ -x "$lockstep" ] || { echo "blas_kernel: build lockstep first ($lockstep)" >&2; exit 1; }
"$python" -c 'import torch' 2>/dev/null || {
  echo "blas_kernel: needs Debian's python3-torch for the GEMM table" >&2
  exit 77
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

corename() {  # the kernel OpenBLAS loads in a process with this environment
  "$python" - <<'EOF'
import ctypes, ctypes.util
lib = ctypes.CDLL("libopenblas.so.0")
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())
EOF
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" \
     "(family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')," \
     "model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')), $(nproc) cores"
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
kernels=(Prescott)
has avx2 && has fma && kernels+=(Haswell)
if has avx512f && has avx512bw && has avx512dq && has avx512vl; then
  kernels+=(SkylakeX)
  has avx512_bf16 && kernels+=(Cooperlake)
fi
auto=$(OPENBLAS_CORETYPE= corename)  # empty is unset to OpenBLAS
echo "environment: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}" \
     "OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-unset}; OpenBLAS' own pick here: $auto;" \
     "kernels this CPU runs: ${kernels[*]}"
echo

gemm_row() {  # kernel -> GFLOP/s for fp32 1T, fp32 2T, bf16 1T, bf16 2T
  OPENBLAS_CORETYPE=$1 OMP_NUM_THREADS=2 "$python" - "$repeats" "$gemm_size" <<'EOF'
import sys, time, torch
repeats, n = int(sys.argv[1]), int(sys.argv[2])
row = []
for dtype in (torch.float32, torch.bfloat16):
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        a @ b
        rates = []
        for _ in range(repeats):
            reps, start = 0, time.perf_counter()
            while time.perf_counter() - start < (1.0 if n >= 1024 else 0.1):
                a @ b
                reps += 1
            rates.append(2 * n**3 * reps / (time.perf_counter() - start) / 1e9)
        row.append(f"{sorted(rates)[len(rates) // 2]:.0f}")
print(" ".join(row))
EOF
}

echo "LibTorch matmul ${gemm_size}x${gemm_size}, GFLOP/s (median of $repeats)"
printf "%-18s %10s %10s %10s %10s\n" kernel "fp32 1T" "fp32 2T" "bf16 1T" "bf16 2T"
for kernel in "${kernels[@]}" ""; do
  read -r -a row < <(gemm_row "$kernel")
  printf "%-18s %10s %10s %10s %10s\n" "${kernel:-own ($auto)}" "${row[@]}"
done
echo

steps_of() {  # model -> steps at this scale (at least 10)
  local base
  case $1 in mlp) base=600 ;; cnn) base=150 ;; resnet) base=40 ;; gpt) base=60 ;; esac
  "$python" -c "print(max(10, int($base * $scale)))"
}

data=$build/data/fortunes
if [ ! -f "$data/train.bin" ] && compgen -G "/usr/share/games/fortunes/*" >/dev/null; then
  "$python" scripts/text-to-tokens "$data" /usr/share/games/fortunes/* >&2
fi

train() {  # model precision before|after -> samples/s (tokens/s for gpt)
  local model=$1 precision=$2 when=$3 spec=examples/fashion_mnist_mlp.json
  local sets=(--set precision="$precision" --set max_steps="$(steps_of "$model")"
              --set global_batch_size=64)
  if [ "$model" = gpt ]; then
    spec=examples/char_lm_fortunes.json
    sets+=(--set data.dir="$data" --set log_every_steps=1000)
  else
    sets+=(--set model="$model" ${BENCH_DATA_DIR:+--set "data.dir=$BENCH_DATA_DIR"})
  fi
  local env=(OPENBLAS_CORETYPE=Prescott)
  [ "$when" = after ] && env=(OPENBLAS_CORETYPE= LOCKSTEP_FAILPOINT=blas_kernel_fallback)
  env "${env[@]}" "$lockstep" local --workers 2 --threads 1 --json "${sets[@]}" "$spec" \
      2>"$tmp/err" | tail -n 1 |
    "$python" -c 'import json, sys; d = json.load(sys.stdin); print(round(d.get("tokens_per_second") or d["samples_per_second"]))' ||
    { echo "blas_kernel: $model $precision $when failed:" >&2; tail -5 "$tmp/err" >&2; return 1; }
}
median() { sort -g | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'; }

echo "lockstep local, 2 workers x 1 thread, global batch 64; samples/s (gpt: tokens/s), median of $repeats"
printf "%-7s %-5s %7s %12s %12s %7s\n" model prec steps before after ratio
for model in $models; do
  if [ "$model" = gpt ] && [ ! -f "$data/train.bin" ]; then
    echo "gpt: no $data/train.bin (apt-get install fortunes); skipped"; continue
  fi
  for precision in $precisions; do
    before=() after=()
    for _ in $(seq "$repeats"); do
      before+=("$(train "$model" "$precision" before)")
      after+=("$(train "$model" "$precision" after)")
    done
    b=$(printf '%s\n' "${before[@]}" | median)
    a=$(printf '%s\n' "${after[@]}" | median)
    printf "%-7s %-5s %7s %12s %12s %7.2f\n" "$model" "$precision" "$(steps_of "$model")" \
        "$b" "$a" "$("$python" -c "print($a / $b)")"
  done
done
