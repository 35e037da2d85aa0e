#!/usr/bin/env bash
# The GPU check, for an air-gapped node with an NVIDIA GPU: CUDA (and NCCL)
# at /usr/local/cuda, Python 3 with a CUDA build of PyTorch (its LibTorch is
# what lockstep links), CMake and a C++ compiler; no Debian -dev packages and
# no network. Everything else comes with the working tree: run
# scripts/fetch-gpu-deps first (where Debian's archive is reachable) and
# carry its folder, build-gpu-deps/, along. In one go, printing progress:
#
#   1. unpacks the .debs into BUILD_DIR/deps-root (dpkg-deb -x; nothing is
#      installed), configures against that prefix, the wheel's LibTorch and
#      CUDA/NCCL with LOCKSTEP_CUDA=ON, and builds the daemons, the CLI,
#      nccl_communicator_test and allreduce_bench with every core;
#   2. runs the NCCL communicator tests (failing if they skipped) and
#      allreduce_bench (its NCCL section must have run), and measures the
#      GPU's GEMM peak in fp32, bf16 and fp16 (bench/roofline.py; the
#      report gives each training cell's share of it);
#   3. trains the MLP, the CNN and the ResNet (examples/*.json) in fp32, bf16
#      and fp16 with `lockstep local --gpus`: 1 worker on NCCL, then 2
#      workers on the one GPU on Gloo (NCCL refuses two ranks on one GPU);
#      and the gpt (block 256, fp32 and bf16) with model.fused true
#      (at::scaled_dot_product_attention) and false, 1 worker on NCCL;
#   4. trains the same models in PyTorch on the same GPU (eager, and DDP
#      with 1 process on NCCL) at the same batch and precision
#      (bench/gpu_reference.py), for samples/s side by side;
#   5. kills a worker (SIGKILL) during a 2-worker GPU run: the time until
#      the job resumed, and the model digest against an uninterrupted run.
#
# One JSON file of results: $OUT/gpu_check.json when OUT is set, else
# BUILD_DIR/gpu_check.json (bench/gpu_check_report.py writes it and prints
# the tables). A check that fails or a feature that is refused is recorded
# with its error and the next check runs. Exit 0: every check passed;
# 1: a check failed (or the build did); 3: none failed, but some were
# skipped to stay within the time budget.
#
#   bench/gpu_check.sh [--configure-only] [BUILD_DIR]      default build-gpu
#
# --configure-only stops after unpacking and configuring: to check the
# prefix and the CMake set-up on a machine without a GPU (with
# TORCH_PREFIX=/usr/lib/x86_64-linux-gnu/cmake, Debian's CPU LibTorch stands
# in for the wheel's).
#
# Environment:
#   GPU_DEPS=build-gpu-deps   scripts/fetch-gpu-deps' folder
#   TORCH_PREFIX=...          LibTorch's CMake prefix (default: the wheel's,
#                             python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
#   PYTHON=python3            the Python with PyTorch
#   CUDAToolkit_ROOT=/usr/local/cuda
#   STEPS=300                 steps of each training run
#   KILL_STEPS=2000           steps of the two runs of the killed-worker check
#   ALLREDUCE_MIB=64          allreduce_bench's largest size
#   BUDGET_S=480              a check that would start after this many seconds
#                             (from the script's start) is skipped
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

configure_only=0
build=build-gpu
for arg in "$@"; do
  case "$arg" in
    --configure-only|--dry-run) configure_only=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check: unknown flag $arg (see --help)" >&2; exit 2 ;;
    *) build=$arg ;;
  esac
done
mkdir -p "$build"
build=$(cd "$build" && pwd)
deps=${GPU_DEPS:-build-gpu-deps}
PYTHON=${PYTHON:-python3}
CUDAToolkit_ROOT=${CUDAToolkit_ROOT:-/usr/local/cuda}
STEPS=${STEPS:-300}
KILL_STEPS=${KILL_STEPS:-2000}
ALLREDUCE_MIB=${ALLREDUCE_MIB:-64}
BUDGET_S=${BUDGET_S:-480}
results=${OUT:+$OUT/gpu_check.json}
results=${results:-$build/gpu_check.json}
work=$build/gpu_check
checks=$work/checks
prefix=$build/deps-root
arch=x86_64-linux-gnu
libdirs="$prefix/usr/lib/$arch:$prefix/usr/lib"
start=$SECONDS

say() { printf '[gpu_check %3ds] %s\n' $((SECONDS - start)) "$*"; }
report() {  # writes the JSON file; its exit status is the script's
  STEPS=$STEPS KILL_STEPS=$KILL_STEPS BUDGET_S=$BUDGET_S \
    "$PYTHON" "$repo/bench/gpu_check_report.py" "$work" "$results"
}
# A failure before any check could run (no GPU, no dependencies, the build):
# recorded as the "setup" step, then the report is written and we stop.
fatal() {
  say "FAILED: $*"
  mkdir -p "$work"
  printf '%s\n' "$*" >"$work/setup_error"
  report
  exit 1
}

rm -rf "$work"
mkdir -p "$checks"

# ---- the machine -------------------------------------------------------------
{
  echo "os=$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}")"
  echo "glibc=$(ldd --version 2>/dev/null | head -n 1)"
  echo "cores=$(nproc)"
  echo "cmake=$(cmake --version 2>/dev/null | head -n 1)"
  echo "ninja=$(ninja --version 2>/dev/null || echo none)"
  echo "nvcc=$("$CUDAToolkit_ROOT/bin/nvcc" --version 2>/dev/null | tail -n 1)"
  echo "gpus=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | paste -sd ';')"
  echo "torch=$("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null)"
} >"$work/machine"
sed 's/^/  /' "$work/machine"

if [ "$configure_only" -eq 0 ]; then
  nvidia-smi -L >/dev/null 2>&1 || fatal "no GPU visible (nvidia-smi failed)"
fi

# ---- the prefix: Debian's packages, unpacked ---------------------------------
ls "$deps"/debs/*.deb >/dev/null 2>&1 ||
  fatal "no packages in $deps/debs: run scripts/fetch-gpu-deps where Debian's archive is reachable, and carry $deps along"
stamp=$( (cd "$deps/debs" && ls -l --time-style=+%s ./*.deb) | md5sum | cut -d' ' -f1)
if [ "$(cat "$prefix/.stamp" 2>/dev/null)" != "$stamp" ]; then
  say "unpacking $(ls "$deps"/debs/*.deb | wc -l) packages into $prefix"
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for deb in "$deps"/debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$prefix" || fatal "dpkg-deb -x $deb failed"
    else  # not a Debian system: a .deb is an ar archive holding data.tar.*
      "$PYTHON" - "$deb" "$prefix" <<'EOF' || fatal "cannot unpack $deb"
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n"
at = 8
while at < len(data):
    name = data[at:at + 16].decode().strip().rstrip("/")
    size = int(data[at + 48:at + 58])
    body = data[at + 60:at + 60 + size]
    if name.startswith("data.tar"):
        if name.endswith(".zst"):
            sys.exit("data.tar.zst needs dpkg-deb or zstd")
        # Debian's packages hold absolute links: no "data" filter.
        kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
        tarfile.open(fileobj=io.BytesIO(body)).extractall(sys.argv[2], **kw)
        break
    at += 60 + size + (size & 1)
EOF
    fi
  done
  # Links that point at /usr/... must point into the prefix.
  find "$prefix" -type l -lname '/*' | while read -r link; do
    ln -sfn "$prefix$(readlink "$link")" "$link"
  done
  # Gloo's CMake package names its library by absolute path
  # (/usr/lib/libgloo.so.0.5.0); make it relative to the package.
  sed -i 's|"/usr/lib/libgloo|"${_IMPORT_PREFIX}/lib/libgloo|g' \
    "$prefix"/usr/share/cmake/Gloo/GlooTargets-*.cmake
  echo "$stamp" >"$prefix/.stamp"
fi
left=$(grep -rlE '"/usr/(lib|include)/' "$prefix"/usr/share/cmake/Gloo 2>/dev/null | head -n 3)
[ -z "$left" ] || fatal "CMake files still name /usr paths: $left"

# protoc and grpc_cpp_plugin run during the build and need the prefix's
# libraries; everything else (compiler, linker, CMake) keeps the node's.
mkdir -p "$build/tools"
for tool in protoc grpc_cpp_plugin; do
  cat >"$build/tools/$tool" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$libdirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$prefix/usr/bin/$tool" "\$@"
EOF
  chmod +x "$build/tools/$tool"
done
"$build/tools/protoc" --version >/dev/null 2>"$work/protoc.err" ||
  fatal "Debian's protoc does not run here ($(head -c 300 "$work/protoc.err")); the node's C library may be older than bookworm's (glibc 2.36)"

# ---- configure ----------------------------------------------------------------
if [ -z "${TORCH_PREFIX:-}" ]; then
  TORCH_PREFIX=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>"$work/torch.err") ||
    fatal "cannot find LibTorch: $PYTHON cannot import torch ($(tail -n 1 "$work/torch.err")); set TORCH_PREFIX"
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# A build folder configured with another generator cannot be reused.
if [ -f "$build/CMakeCache.txt" ] &&
   ! grep -q "^CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}$" "$build/CMakeCache.txt"; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi
# -L: gRPC's CMake package links re2 by name alone (-lre2).
link_flags="-L$prefix/usr/lib/$arch -Wl,--disable-new-dtags -Wl,-rpath-link,$prefix/usr/lib/$arch -Wl,-rpath-link,$prefix/usr/lib"
say "configuring (LibTorch from $TORCH_PREFIX)"
# pkg-config, where the node has one, must not find the node's own packages:
# libmicrohttpd and GnuTLS are then found by header and library in the prefix.
PATH="$CUDAToolkit_ROOT/bin:$PATH" TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
PKG_CONFIG_LIBDIR=/nonexistent PKG_CONFIG_PATH= \
cmake -S . -B "$build" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DLOCKSTEP_CUDA=ON -DCUDAToolkit_ROOT="$CUDAToolkit_ROOT" \
    -DCMAKE_LIBRARY_ARCHITECTURE=$arch \
    -DCMAKE_PREFIX_PATH="$prefix/usr;$prefix/usr/lib/$arch/cmake;$prefix/usr/share/cmake;$TORCH_PREFIX" \
    -Dabsl_DIR="$prefix/usr/lib/$arch/cmake/absl" \
    -DgRPC_DIR="$prefix/usr/lib/$arch/cmake/grpc" \
    -DGloo_DIR="$prefix/usr/share/cmake/Gloo" \
    -DGTest_DIR="$prefix/usr/lib/$arch/cmake/GTest" \
    -DProtobuf_INCLUDE_DIR="$prefix/usr/include" \
    -DProtobuf_LIBRARY="$prefix/usr/lib/$arch/libprotobuf.so" \
    -DProtobuf_PROTOC_LIBRARY="$prefix/usr/lib/$arch/libprotoc.so" \
    -DProtobuf_PROTOC_EXECUTABLE="$build/tools/protoc" \
    -DGRPC_CPP_PLUGIN="$build/tools/grpc_cpp_plugin" \
    -DOPENSSL_ROOT_DIR="$prefix/usr" -DZLIB_ROOT="$prefix/usr" \
    -DOPENSSL_INCLUDE_DIR="$prefix/usr/include" \
    -DOPENSSL_CRYPTO_LIBRARY="$prefix/usr/lib/$arch/libcrypto.so" \
    -DOPENSSL_SSL_LIBRARY="$prefix/usr/lib/$arch/libssl.so" \
    -DSQLite3_INCLUDE_DIR="$prefix/usr/include" \
    -DSQLite3_LIBRARY="$prefix/usr/lib/$arch/libsqlite3.so" \
    -DCMAKE_CXX_FLAGS="-isystem $prefix/usr/include/$arch" \
    -DCMAKE_EXE_LINKER_FLAGS="$link_flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="$link_flags" \
    -DCMAKE_BUILD_RPATH="$prefix/usr/lib/$arch;$prefix/usr/lib" \
    >"$work/configure.log" 2>&1 ||
  fatal "cmake configure failed; the end of $work/configure.log:
$(tail -n 25 "$work/configure.log")"
grep -E "NCCL backend|Found (Protobuf|OpenSSL|ZLIB|SQLite3|GTest|CUDAToolkit)" "$work/configure.log" | sed 's/^-- /  /'
# Everything but the compiler's own files and CUDA must come from the prefix
# or LibTorch, never from the system's /usr (the node has none of it; here,
# on a development machine, it would hide a missing package).
strays=$(grep -E '^(absl|gRPC|Gloo|GTest|Protobuf|OPENSSL|ZLIB|SQLite3|JPEG|PNG|MICROHTTPD|GNUTLS)[A-Za-z_]*(DIR|LIBRARY|LIBRARIES|INCLUDE_DIR|EXECUTABLE|FILE|RELEASE)[^=]*=/usr/' \
  "$build/CMakeCache.txt" | grep -v "=$prefix" || true)
[ -z "$strays" ] || fatal "configured against the system's /usr instead of $prefix:
$strays"
if [ "$configure_only" -eq 1 ]; then
  say "configured $build against $prefix (--configure-only: stopping here)"
  exit 0
fi

# ---- build --------------------------------------------------------------------
targets=(lockstep-coordinator lockstep-worker lockstep nccl_communicator_test allreduce_bench
         lockstep-example-data)
say "building ${targets[*]} with $(nproc) jobs"
# Keep going past a failed file: one build names every error at once.
keep_going=(-k)
[ ${#generator[@]} -eq 0 ] || keep_going=(-k 0)
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" -- "${keep_going[@]}" >"$work/build.log" 2>&1 &
build_pid=$!
ticks=0
while kill -0 "$build_pid" 2>/dev/null; do
  sleep 1
  ticks=$((ticks + 1))
  [ $((ticks % 20)) -ne 0 ] || say "  building: $(grep -oE '^\[[0-9]+/[0-9]+\]' "$work/build.log" | tail -n 1)"
done
wait "$build_pid" ||
  fatal "the build failed; the end of $work/build.log:
$(grep -E -A 12 'error|FAILED' "$work/build.log" | head -n 40)"
say "built"
bin=$build/bin
run_env=(env "LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

# ---- checks ---------------------------------------------------------------------
seq=0
# new_check NAME KIND [key=value ...]: a folder for one check's files.
new_check() {
  seq=$((seq + 1))
  dir=$checks/$(printf '%02d' $seq)-$1
  mkdir -p "$dir"
  echo "$2" >"$dir/kind"
  shift 2
  printf '%s\n' "$@" >"$dir/meta"
}
# A check that would start past the budget is skipped (and recorded).
over_budget() {
  if [ $((SECONDS - start)) -ge "$BUDGET_S" ]; then
    echo "skipped: ${BUDGET_S} s budget spent" >"$dir/skipped"
    say "  skipped ($(basename "$dir")): over the ${BUDGET_S} s budget"
    return 0
  fi
  return 1
}
summary() { "$PYTHON" "$repo/bench/gpu_check_report.py" --summary "$dir"; }

say "NCCL communicator tests"
new_check nccl_tests gtest
timeout -k 5 120 "${run_env[@]}" "$bin/nccl_communicator_test" >"$dir/stdout" 2>"$dir/stderr"
echo $? >"$dir/rc"
summary

say "all-reduce bench (up to $ALLREDUCE_MIB MiB)"
new_check allreduce_bench allreduce
timeout -k 5 120 "${run_env[@]}" "$bin/allreduce_bench" "$ALLREDUCE_MIB" >"$dir/stdout" 2>"$dir/stderr"
echo $? >"$dir/rc"
summary

# The roofline's denominator: this GPU's own matrix-product peak per
# precision; the report gives each training cell's share of it.
say "the GPU's GEMM peak (bench/roofline.py)"
new_check gemm_peak roofline
timeout -k 5 90 "$PYTHON" bench/roofline.py --device cuda --gemm 8192 \
    --precisions fp32 bf16 fp16 --json "$dir/peaks.json" >"$dir/stdout" 2>"$dir/stderr"
echo $? >"$dir/rc"
summary

data_dir=$(cd "$deps/fashion-mnist" 2>/dev/null && pwd) || data_dir=/usr/share/datasets/fashion-mnist
# train MODEL PRECISION WORKERS BACKEND
train() {
  new_check "train-$1-$2-$3w-$4" train model="$1" precision="$2" workers="$3" backend="$4" steps="$STEPS"
  over_budget && return
  timeout -k 10 150 "${run_env[@]}" "$bin/lockstep" local --workers "$3" --gpus --json \
      --set communication.backend="$4" --set precision="$2" --set max_steps="$STEPS" \
      --set data.dir="$data_dir" "examples/fashion_mnist_$1.json" >"$dir/stdout" 2>"$dir/stderr"
  echo $? >"$dir/rc"
  summary
}
models=(mlp cnn resnet)
precisions=(fp32 bf16 fp16)

say "training on the GPU, 1 worker on NCCL, $STEPS steps each"
for model in "${models[@]}"; do
  for precision in "${precisions[@]}"; do train "$model" "$precision" 1 nccl; done
done

# The gpt (issue 56): model.fused calls at::scaled_dot_product_attention on
# a GPU with LibTorch 2, against LibTorch's unfused ops; tokens of the
# example-data Markov chain, block 256, 1 worker on NCCL.
say "the gpt on the GPU, fused (SDPA) and unfused attention, $STEPS steps each"
lm_data=$work/markov
if "$bin/lockstep-example-data" markov "$lm_data" >"$work/markov.log" 2>&1; then
  for precision in fp32 bf16; do
    for fused in true false; do
      new_check "lm-gpt-$precision-fused-$fused" lm model=gpt precision="$precision" \
        fused="$fused" steps="$STEPS"
      over_budget && continue
      timeout -k 10 150 "${run_env[@]}" "$bin/lockstep" local --workers 1 --gpus --json \
          --set precision="$precision" --set model.fused="$fused" --set max_steps="$STEPS" \
          --set data.dir="$lm_data" --set data.block_size=256 \
          examples/char_lm_fortunes.json >"$dir/stdout" 2>"$dir/stderr"
      echo $? >"$dir/rc"
      summary
    done
  done
else
  new_check lm-gpt-data lm model=gpt
  cp "$work/markov.log" "$dir/stderr"
  echo 1 >"$dir/rc"
  summary
fi

say "PyTorch on the same GPU (eager, and DDP with 1 process), $STEPS steps each"
new_check pytorch_reference reference steps="$STEPS"
if ! over_budget; then
  jobs=()
  for model in "${models[@]}"; do jobs+=(--job "examples/fashion_mnist_$model.json"); done
  timeout -k 10 240 "$PYTHON" bench/gpu_reference.py "${jobs[@]}" --data "$data_dir" \
      --steps "$STEPS" --precisions "$(IFS=,; echo "${precisions[*]}")" --modes eager,ddp \
      >"$dir/stdout" 2>"$dir/stderr"
  echo $? >"$dir/rc"
  summary
fi

# A worker killed during a 2-worker GPU run (Gloo: both ranks share the
# GPU), against the same run uninterrupted. `lockstep local` restarts the
# dead worker; the job resumes from the survivor's state. Progress lines are
# stamped as they arrive: the resume time is SIGKILL to the new
# generation's "resumed" event as the CLI sees it.
say "a worker killed during a GPU run (MLP, 2 workers, Gloo, $KILL_STEPS steps)"
new_check recovery recovery model=mlp workers=2 backend=gloo steps="$KILL_STEPS"
kill_args=(local --workers 2 --gpus --json --set communication.backend=gloo
           --set max_steps="$KILL_STEPS" --set epochs=100 --set log_every_steps=1
           --set data.dir="$data_dir" examples/fashion_mnist_mlp.json)
child_of() {  # PARENT NAME: a child process of PARENT running NAME
  local p stat rest
  for p in /proc/[0-9]*; do
    stat=$(cat "$p/stat" 2>/dev/null) || continue
    rest=${stat##*) }
    set -- "$1" "$2" $rest
    if [ "$4" = "$1" ] && tr '\0' '\n' <"$p/cmdline" 2>/dev/null | head -n 1 | grep -q "$2\$"; then
      echo "${p#/proc/}"
      return 0
    fi
  done
  return 1
}
stamp_lines() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done; }
if ! over_budget; then
  timeout -k 10 150 "${run_env[@]}" "$bin/lockstep" "${kill_args[@]}" \
      >"$dir/reference.stdout" 2>"$dir/reference.stderr"
  echo $? >"$dir/reference.rc"
  # Through a FIFO: a process substitution would be lockstep's own child,
  # and lockstep waits for its children before it exits.
  rm -f "$dir/stderr.fifo"
  mkfifo "$dir/stderr.fifo"
  stamp_lines <"$dir/stderr.fifo" >"$dir/stderr" &
  stamper=$!
  "${run_env[@]}" "$bin/lockstep" "${kill_args[@]}" >"$dir/stdout" 2>"$dir/stderr.fifo" &
  local_pid=$!  # env execs lockstep: its process
  for _ in $(seq 300); do  # up to 30 s for the first progress line of training
    grep -q "samples/s  ETA" "$dir/stderr" 2>/dev/null && break
    kill -0 "$local_pid" 2>/dev/null || break
    sleep 0.1
  done
  sleep 0.5  # well inside the run
  victim=$(child_of "$local_pid" lockstep-worker)
  if [ -n "$victim" ] && kill -0 "$local_pid" 2>/dev/null; then
    echo "$EPOCHREALTIME" >"$dir/kill_time"
    kill -KILL "$victim"
    say "  killed worker process $victim"
  else
    say "  no worker to kill (the run ended or never trained)"
  fi
  for _ in $(seq 1500); do  # a watchdog: 150 s
    kill -0 "$local_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$local_pid" 2>/dev/null && kill -KILL "$local_pid"  # its workers die with it (PDEATHSIG)
  wait "$local_pid"
  echo $? >"$dir/rc"
  wait "$stamper"
  rm -f "$dir/stderr.fifo"
  summary
fi

say "training on the GPU, 2 workers on Gloo (one GPU), $STEPS steps each"
for model in "${models[@]}"; do
  for precision in "${precisions[@]}"; do train "$model" "$precision" 2 gloo; done
done

say "done in $((SECONDS - start)) s"
report
