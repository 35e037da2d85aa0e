# lockstep: the two set-up commands are `make demo` and `make test`.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo bench clean format

all: build

deps:
	@bash scripts/install-deps

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

demo: build
	@$(BUILD_DIR)/bin/lockstep local --workers 2 examples/fashion_mnist_mlp.json

bench: build
	@cmake --build $(BUILD_DIR) --target recovery_bench allreduce_bench -j $(JOBS)
	@$(BUILD_DIR)/bin/allreduce_bench 256
	@bash bench/train_scaling.sh $(BUILD_DIR)
	@$(BUILD_DIR)/bin/recovery_bench $(BUILD_DIR)/bin 7

format:
	@clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	@rm -rf $(BUILD_DIR)
