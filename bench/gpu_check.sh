#!/usr/bin/env bash
# GPU checks, for a Debian machine with an NVIDIA GPU, CUDA and NCCL (the
# CI machines have none, so there these tests skip). Builds with the NCCL
# backend required and runs the NCCL tests, failing if they skipped, then the
# all-reduce benchmark.
#
#   bench/gpu_check.sh [BUILD_DIR]     (CUDAToolkit_ROOT=... if not /usr/local/cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}

nvidia-smi -L || { echo "gpu_check: no GPU visible (nvidia-smi failed)" >&2; exit 1; }
bash scripts/install-deps
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=ON \
    ${CUDAToolkit_ROOT:+-DCUDAToolkit_ROOT="$CUDAToolkit_ROOT"} >/dev/null
cmake --build "$build" -j "$(nproc)" --target nccl_communicator_test allreduce_bench

out=$("$build/bin/nccl_communicator_test" 2>&1) || { echo "$out"; exit 1; }
echo "$out"
if echo "$out" | grep -q "SKIPPED"; then
  echo "gpu_check: the NCCL tests skipped although a GPU is visible" >&2
  exit 1
fi
"$build/bin/allreduce_bench" 256
