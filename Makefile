# Thin wrappers around scripts/setup.sh + CMake presets. The README's two
# commands are `./scripts/setup.sh && make demo` and `./scripts/setup.sh && make test`.
.PHONY: setup build demo test build-asan test-asan stress fuzz bench format clean

setup:
	./scripts/setup.sh

# Then the Python package into .venv/, as users install it (pip install
# ./python); its build reuses build/, where the extension is already built.
build:
	./scripts/setup.sh
	cmake --preset default
	cmake --build --preset default
	.venv/bin/pip install --no-build-isolation --disable-pip-version-check -q ./python

demo: build
	./scripts/demo.sh build/bin/meshplan

test: build
	ctest --preset default

# The suite STRESS_RUNS times (default 3) beside one busy process per core;
# prints per test its passes and failures (scripts/stress-test.sh,
# docs/reliability.md). `make stress STRESS_RUNS=5`.
STRESS_RUNS ?= 3
stress: build
	./scripts/stress-test.sh -n $(STRESS_RUNS)

# The whole suite built by clang-22 with AddressSanitizer +
# UndefinedBehaviorSanitizer (no recovery) and LeakSanitizer in build-asan/,
# including one short fuzz.* run per libFuzzer target; the sanitizer options
# come from the test preset (docs/reliability.md).
test-asan: build-asan
	ctest --preset asan

build-asan:
	./scripts/setup.sh
	cmake --preset asan
	cmake --build --preset asan

# Coverage-guided fuzzing (docs/reliability.md): builds the fuzz targets of
# the asan preset, then runs each for FUZZ_SECONDS over its seed corpus
# (fuzz/corpus/, never modified) and a work corpus kept in
# build-asan/fuzz-work/ between runs; findings go to
# build-asan/fuzz-artifacts/TARGET/. One line per target: runs, coverage,
# time, findings. `make fuzz FUZZ_SECONDS=60 FUZZ_TARGETS="spec dist"`.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= spec plan plan-set view placement layout dist checkpoint
# Keep going after a finding: each one is saved, and the run lasts the set time.
FUZZ_FLAGS ?= -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1
fuzz:
	./scripts/setup.sh
	cmake --preset asan
	cmake --build --preset asan --target fuzzers
	@status=0; for t in $(FUZZ_TARGETS); do \
	  bash fuzz/run-fuzzer.sh --work build-asan/fuzz-work/$$t \
	    --artifacts build-asan/fuzz-artifacts/$$t build-asan/bin/fuzz-$$t \
	    fuzz/corpus/$$t $(FUZZ_SECONDS) $(FUZZ_FLAGS) || status=1; \
	done; exit $$status

bench: build
	./bench/run.sh build

format:
	git ls-files '*.h' '*.cpp' | xargs clang-format-19 -i

clean:
	rm -rf build build-debug build-asan
