# Makefile — the two commands of the README, and the pieces they are made of.
#   make demo   install deps, build, run the main job
#   make test   install deps, build, run every test (unit, Python, sanitizers, fuzz)
BUILD ?= build
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 20
# the wall-clock second make started, and a line per stage with the seconds since: CI's log
# then says which stage took its time (CI stops at 90 minutes)
T0 := $(shell date +%s)
ELAPSED = $$(($$(date +%s) - $(T0)))
STAMP = echo "== make $$(date +%T) ($(ELAPSED) s in):"

.PHONY: demo tree-demo test deps deps-test build build-asan build-tsan build-fuzz unit pytest asan tsan fuzz bench clean

# The main job: DDTree decoding with the shipped pair (models/README.md) on a held-out prompt,
# on the GPU when the build has CUDA and one is present, else on the CPU.
demo: deps build
	./$(BUILD)/ddtree generate --model models/pystdlib-target --draft models/pystdlib-dflash \
	    --mode tree --budget 20 --prompt-file examples/heldout_prompt.py --max-tokens 128 --backend auto

# The tree builder and walk on a small problem, drawn.
tree-demo: build
	./$(BUILD)/ddtree tree --draw < examples/tree_problem.json

test: deps-test build unit pytest asan tsan fuzz
	@echo "make test: all tests passed ($(ELAPSED) s)"

deps:
	scripts/install-deps.sh
deps-test:
	scripts/install-deps.sh --tests

build:
	@$(STAMP) build
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

unit: build
	@$(STAMP) unit
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

pytest: build
	@$(STAMP) pytest
	DDT_BUILD_DIR=$(abspath $(BUILD)) python3 -m pytest -q tests/python

build-asan:
	@$(STAMP) build-asan
	CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDDT_SANITIZE=ON -DDDT_CUDA=OFF >/dev/null
	cmake --build build-asan -j $(JOBS)

asan: build-asan
	@$(STAMP) asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)
	DDT_BUILD_DIR=$(abspath build-asan) DDT_PYTEST_QUICK=1 ASAN_OPTIONS=detect_leaks=0 python3 -m pytest -q tests/python -k "cli"

# ThreadSanitizer over the tests that run the CPU pool and the engine on several threads, and
# the chat templates rendered from several threads at once
TSAN_TESTS = test_cpu_ops test_engine test_jinja
build-tsan:
	@$(STAMP) build-tsan
	CC=clang cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DDDT_TSAN=ON -DDDT_CUDA=OFF >/dev/null
	cmake --build build-tsan -j $(JOBS) --target $(TSAN_TESTS)

tsan: build-tsan
	@$(STAMP) tsan
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) -R '^($(subst $() ,|,$(TSAN_TESTS)))$$'

build-fuzz:
	@$(STAMP) build-fuzz
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DDDT_FUZZ=ON -DDDT_CUDA=OFF >/dev/null
	cmake --build build-fuzz -j $(JOBS)

fuzz: build-fuzz
	@$(STAMP) fuzz
	scripts/run-fuzz.sh build-fuzz $(FUZZ_SECONDS)

bench: build
	./$(BUILD)/bench_tree

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
