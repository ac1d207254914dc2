# Thin wrapper: the two commands a newcomer needs are `make run` and `make test`.
# Everything real lives in CMakeLists.txt; dependencies come from deploy/install-deps.sh.
BUILD      ?= build
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CTEST_ARGS ?=

.PHONY: deps build build-release build-asan run test bench conformance clean fuzz tsan

deps:
	@./deploy/install-deps.sh

# Release build in build/ (binaries build/sluice, build/sluicectl).
build-release: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSLUICE_SANITIZE=OFF >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build: build-release

# Sanitizer build (ASan + UBSan) in build/ as well, so tests exercise build/sluice.
build-asan: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

run: build-release
	@mkdir -p data
	./$(BUILD)/sluice --storage.path=./data

test: build-asan
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

bench: build-release
	@if [ -x bench/run.sh ]; then bench/run.sh; else echo "bench: no benchmarks yet"; fi

# Prometheus 2.42's PromQL test scripts live outside the repository; pass their folder.
PROMQL_TESTS ?= ../shared/conformance/promql-2.42
conformance: build-release
	@./$(BUILD)/tests/tools/promql_test -q $(PROMQL_TESTS) tests/promql

# libFuzzer targets (tests/fuzz/, clang) in build-fuzz, each run for FUZZ_SECONDS; `make test`
# runs a short pass of the same (ctest fuzz/short). Reproducers land in build-fuzz/artifacts/.
FUZZ_SECONDS ?= 30
fuzz: deps
	@tests/fuzz/run.sh --build build-fuzz --seconds $(FUZZ_SECONDS) --jobs $(JOBS)

# ThreadSanitizer build in build-tsan: the concurrency tests (unit tests of the threaded
# subsystems and one daemon test), see tests/tsan.sh.
tsan: deps
	@tests/tsan.sh build-tsan $(JOBS)

clean:
	rm -rf $(BUILD)
