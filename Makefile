# The two commands a newcomer needs:  `make run`  and  `make test`.
# Everything else wraps CMake. Build directories: build/ (default), build-asan/, build-bench/.
BUILD       ?= build
CMAKE_FLAGS ?=
JOBS        ?= $(shell nproc)

.PHONY: all deps configure build run test bench asan fuzz format format-check tidy clean help

all: build

help:
	@echo "make run           build and start one kagentd node (embedded database) in the foreground"
	@echo "make test          install deps, build, run every test (unit + integration)"
	@echo "make bench         build with optimisation and run bench/ (prints BENCH lines)"
	@echo "make asan          ASan+UBSan build running the whole suite"
	@echo "make fuzz          libFuzzer targets (clang) for FUZZ_SECONDS each on tests/fuzz/corpus"
	@echo "make format        clang-format the tree;  make format-check  checks it"
	@echo "make clean         remove build directories"

deps:
	@deploy/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

run: build
	deploy/run-node.sh $(BUILD)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) $(CTEST_ARGS)

asan: deps
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DKAGENT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS)"

bench: deps
	cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DKAGENT_BENCH=ON $(CMAKE_FLAGS)
	cmake --build build-bench -j $(JOBS)
	bench/run-all.sh build-bench

# Fuzzing (tests/fuzz): clang, libFuzzer + ASan + UBSan, in build-fuzz/. Each target runs for
# FUZZ_SECONDS on its corpus; a crash, leak or timeout fails, its reproducer left in build-fuzz/.
FUZZ_SECONDS ?= 60

fuzz: deps
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKAGENT_FUZZ=ON -DKAGENT_BENCH=OFF \
	      -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)
	cmake --build build-fuzz -j $(JOBS) --target kagent_fuzzers
	tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

FORMAT_FILES = $(shell git ls-files '*.c' '*.h' | grep -v '^proto/')

format:
	clang-format -i $(FORMAT_FILES)

format-check:
	@clang-format --dry-run --Werror $(FORMAT_FILES) && echo "format-check: clean"

tidy: build
	clang-tidy -p $(BUILD) --quiet $(filter %.c,$(FORMAT_FILES))

clean:
	rm -rf build build-asan build-bench build-fuzz
