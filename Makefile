# lockstep: the two set-up commands are `make demo` and `make test`.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# The Clang build with ASan + UBSan, the fuzzers and the thread-safety
# analysis (`make sanitize`, `make fuzz`, `make thread-safety`).
SAN_DIR ?= build-san
# Inputs per fuzz target in `make fuzz` (ctest runs LOCKSTEP_FUZZ_RUNS).
FUZZ_RUNS ?= 1000000
# ccache keys on paths relative to the checkout, so a second clone (CI's, a
# worktree) reuses what the first compiled.
export CCACHE_BASEDIR ?= $(CURDIR)

.PHONY: all deps configure build test demo bench clean format thread-safety \
	san-configure sanitize fuzz images e2e install

all: build

deps:
	@bash scripts/install-deps

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The binaries into PREFIX/bin and the Python package into Debian's Python
# path under PREFIX (lib/python3/dist-packages for /usr,
# lib/python3.X/dist-packages otherwise). PREFIX=/usr/local by default.
PREFIX ?= /usr/local
install: build
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	@cmake --install $(BUILD_DIR)

test: build thread-safety sanitize
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

san-configure: deps
	@CC=clang CXX=clang++ cmake -S . -B $(SAN_DIR) -DCMAKE_BUILD_TYPE=Release \
	    -DLOCKSTEP_SANITIZE=ON -DLOCKSTEP_THREAD_SAFETY=ON >/dev/null

# Clang's thread-safety analysis over every library: the coordinator, the
# worker (agent, collectives, checkpointer, trainer) and the CLI's processes.
# It shares the sanitizer build's folder; the trainer (LibTorch) is only
# compiled there, never linked or run.
thread-safety: san-configure
	@cmake --build $(SAN_DIR) -j $(JOBS) --target lockstep_coordinator_lib \
	    lockstep_worker_core lockstep_trainer lockstep_process

# The unit tests that need no LibTorch under AddressSanitizer and
# UndefinedBehaviorSanitizer, and every fuzzer over its corpus
# (tests/fuzz/corpus/) plus a fixed number of inputs from a fixed seed.
sanitize: san-configure
	@cmake --build $(SAN_DIR) -j $(JOBS) --target sanitize_tests
	@cd $(SAN_DIR) && ctest --output-on-failure -j $(JOBS)

# Each fuzzer for FUZZ_RUNS inputs (FUZZ_TARGETS: a subset), its new inputs
# kept in $(SAN_DIR)/fuzz-corpus/NAME between runs. A crash stops it and
# leaves crash-* there: add it to tests/fuzz/corpus/NAME/ with the fix.
FUZZ_TARGETS ?= job_spec tf_config checkpoint idx npy tokens tfrecord tf_example data_plane coordinator
fuzz: san-configure
	@cmake --build $(SAN_DIR) -j $(JOBS) --target sanitize_tests
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(SAN_DIR)/fuzz-corpus/$$t && \
	  UBSAN_OPTIONS=print_stacktrace=1 $(SAN_DIR)/bin/$${t}_fuzz \
	    -runs=$(FUZZ_RUNS) -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
	    -artifact_prefix=$(SAN_DIR)/fuzz-corpus/$$t/ \
	    $$( [ $$t = coordinator ] && echo -close_fd_mask=2 ) \
	    $(SAN_DIR)/fuzz-corpus/$$t tests/fuzz/corpus/$$t || exit 1; \
	done

# The container images (deploy/README.md "Images"): lockstep-cpu:dev with
# docker, or offline with Debian's podman/buildah and a Debian base image made
# from the archive; LOCKSTEP_GPU_IMAGE=1 also lockstep-gpu:dev. Prints sizes.
# The CPU image takes the binaries of $(BUILD_DIR) (lockstep-worker-cpu: the
# worker without the NCCL backend), so after `make build` nothing compiles
# again; FROM_SOURCE=1 compiles them inside the image build instead.
FROM_SOURCE ?= 0
images:
	@FROM_SOURCE=$(FROM_SOURCE) BUILD_DIR=$(BUILD_DIR) bash scripts/build-images

demo: build
	@$(BUILD_DIR)/bin/lockstep local --workers 2 examples/fashion_mnist_mlp.json

# The full benchmarks (minutes each; results in docs/BENCHMARKS.md). `make
# test` runs each once at a tiny size (ctest -L bench-smoke), and the chaos
# soak with a fixed seed and 5 faults (ctest -L soak).
bench: build
	@$(BUILD_DIR)/bin/allreduce_bench 256
	@$(BUILD_DIR)/bin/handover_bench examples/fashion_mnist_resnet.json 50
	@$(BUILD_DIR)/bin/handover_bench examples/fashion_mnist_cnn.json 50
	@bash bench/train_scaling.sh $(BUILD_DIR)
	@bash bench/tls_overhead.sh $(BUILD_DIR)
	@bash bench/data_plane_cost.sh $(BUILD_DIR)
	@bash bench/metrics_overhead.sh $(BUILD_DIR)
	@$(BUILD_DIR)/bin/recovery_bench $(BUILD_DIR)/bin 7
	@$(BUILD_DIR)/bin/coordinator_scale $(BUILD_DIR)/bin/lockstep-coordinator 100 1000 5000
	@$(BUILD_DIR)/bin/scheduling_sim
	@$(BUILD_DIR)/bin/scheduling_sim --age-after 14400 --policies priority
	@$(BUILD_DIR)/bin/recovery_bench $(BUILD_DIR)/bin 7 --restore
	@$(BUILD_DIR)/bin/recovery_bench $(BUILD_DIR)/bin 7 --spare
	@bash bench/checkpoint_stall.sh $(BUILD_DIR)
	@$(BUILD_DIR)/bin/checkpoint_io_bench $${TMPDIR:-/tmp} 256
	@bash bench/ddp_compare.sh $(BUILD_DIR)
	@bash bench/precision_compare.sh $(BUILD_DIR)
	@$(BUILD_DIR)/bin/chaos_soak $(BUILD_DIR)/bin --faults 12

# The deployment run on this machine (scripts/e2e, as root): the CPU image
# built, the `cpu` overlay played as containers with podman on 127.0.0.1, the
# example job submitted by its submit Job, then run again with worker 1 killed
# mid-job (same model digest), then everything removed. E2E_BUILD=0 uses the
# image already built.
e2e:
	@BUILD_DIR=$(BUILD_DIR) bash scripts/e2e

format:
	@clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	@rm -rf $(BUILD_DIR) $(SAN_DIR)
