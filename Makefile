# lockstep: the two set-up commands are `make demo` and `make test`.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# ccache keys on paths relative to the checkout, so a second clone (CI's, a
# worktree) reuses what the first compiled.
export CCACHE_BASEDIR ?= $(CURDIR)

.PHONY: all deps configure build test demo bench clean format thread-safety

all: build

deps:
	@bash scripts/install-deps

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build thread-safety
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# Clang's thread-safety analysis over every library: the coordinator, the
# worker (agent, collectives, checkpointer, trainer) and the CLI's processes.
thread-safety: deps
	@CC=clang CXX=clang++ cmake -S . -B build-tsa -DCMAKE_BUILD_TYPE=Release \
	    -DLOCKSTEP_THREAD_SAFETY=ON >/dev/null
	@cmake --build build-tsa -j $(JOBS) --target lockstep_coordinator_lib \
	    lockstep_worker_core lockstep_trainer lockstep_process

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
	@$(BUILD_DIR)/bin/recovery_bench $(BUILD_DIR)/bin 7
	@$(BUILD_DIR)/bin/coordinator_scale $(BUILD_DIR)/bin/lockstep-coordinator 100 1000 5000
	@$(BUILD_DIR)/bin/recovery_bench $(BUILD_DIR)/bin 7 --restore
	@$(BUILD_DIR)/bin/recovery_bench $(BUILD_DIR)/bin 7 --spare
	@bash bench/checkpoint_stall.sh $(BUILD_DIR)
	@$(BUILD_DIR)/bin/checkpoint_io_bench $${TMPDIR:-/tmp} 256
	@bash bench/ddp_compare.sh $(BUILD_DIR)
	@bash bench/precision_compare.sh $(BUILD_DIR)
	@$(BUILD_DIR)/bin/chaos_soak $(BUILD_DIR)/bin --faults 12

format:
	@clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	@rm -rf $(BUILD_DIR) build-tsa
