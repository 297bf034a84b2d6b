# Thin wrappers around scripts/setup.sh + CMake presets. The README's two
# commands are `./scripts/setup.sh && make demo` and `./scripts/setup.sh && make test`.
.PHONY: setup build demo test test-asan bench format clean

setup:
	./scripts/setup.sh

build:
	./scripts/setup.sh
	cmake --preset default
	cmake --build --preset default

demo: build
	./scripts/demo.sh build/bin/meshplan

test: build
	ctest --preset default

# The whole suite built with AddressSanitizer + UndefinedBehaviorSanitizer
# (no recovery) in build-asan/; ASAN_OPTIONS come from the test preset.
test-asan:
	./scripts/setup.sh
	cmake --preset asan
	cmake --build --preset asan
	ctest --preset asan

bench: build
	./bench/run.sh build

format:
	git ls-files '*.h' '*.cpp' | xargs clang-format-19 -i

clean:
	rm -rf build build-debug build-asan
