# Thin wrapper: the two commands a newcomer needs are `make run` and `make test`.
# Everything real lives in CMakeLists.txt; dependencies come from deploy/install-deps.sh.
#
# Two build folders, so the two builds never rebuild each other:
#   build/       Release (make build, make run, make bench): build/sluice, build/sluicectl
#   build-asan/  Debug with ASan + UBSan (make test, make check): the binary the tests start
# Test tiers (ctest labels unit, promql, integration, peer, slow, fuzz; pick any with ctest -L):
#   make check   unit tests, PromQL scripts, fast integration tests (everything not `slow`)
#   make test    everything: the CI gate (.ci/run)
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
# Integration tests mostly wait on daemons and peers, so ctest runs more of them than cores.
TEST_JOBS  ?= $(shell echo $$(( $(JOBS) * 2 )))
CTEST_ARGS ?=

.PHONY: deps build build-release build-asan run test check bench conformance clean fuzz tsan

deps:
	@./deploy/install-deps.sh

# Release build in build/ (binaries build/sluice, build/sluicectl).
build-release: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSLUICE_SANITIZE=OFF >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build: build-release

# Sanitizer build (ASan + UBSan) in build-asan/: the tests exercise build-asan/sluice.
build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

run: build-release
	@mkdir -p data
	./$(BUILD)/sluice --storage.path=./data

test: build-asan
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j $(TEST_JOBS) $(CTEST_ARGS)

# The developer's loop: everything but the tests labelled slow (long integration tests, the
# fuzz run, peers that take minutes).
check: build-asan
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j $(TEST_JOBS) -LE slow $(CTEST_ARGS)

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
	rm -rf $(BUILD) $(ASAN_BUILD)
