#!/bin/sh
# The whole test suite on a fresh Debian 12 machine, as root: installs the
# dependencies, checks formatting and the golden vectors, builds a release
# build with -Werror and an ASan+UBSan build, runs every fuzz target briefly,
# smoke-runs the benchmarks, and runs every test in both builds.
#   scripts/test.sh              (FUZZ_SECONDS=60 by default)
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=$(nproc)
step() { printf '\n==== %s\n' "$*"; }

step "dependencies"
./scripts/install-deps.sh >/tmp/llmgw-install-deps.log 2>&1 || {
  cat /tmp/llmgw-install-deps.log; exit 1; }

step "format"
./scripts/check-format.sh

step "layers: every folder includes only the folders below it"
/usr/bin/python3 scripts/check-layers.py

step "golden vectors reproduce from the Python reference"
/usr/bin/python3 golden/make_block_hash_vectors.py --check

step "release build (-Werror)"
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLMGW_WERROR=ON >/dev/null
ninja -C build-release -j "$jobs"

step "clang-tidy"
./scripts/tidy.sh build-release

step "ASan+UBSan build (-Werror)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLLMGW_WERROR=ON -DLLMGW_SANITIZE=ON \
  -DLLMGW_BENCH=OFF >/dev/null
ninja -C build-asan -j "$jobs"

step "fuzz every target (${FUZZ_SECONDS:-60} s each)"
./scripts/fuzz.sh "${FUZZ_SECONDS:-60}"

step "benchmarks run (numbers are not checked here; see BENCHMARKS.md)"
./build-release/bench/llmgw-bench wire --rounds 3
./build-release/bench/llmgw-bench agent --rounds 3
./build-release/bench/llmgw-bench agent-actors --rounds 3
./build-release/bench/llmgw-bench router --rounds 3

step "tests, ASan+UBSan build"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$root/scripts/ubsan.supp
(cd build-asan && ctest --output-on-failure -j "$jobs" --timeout 300)

step "tests, release build"
(cd build-release && ctest --output-on-failure -j "$jobs" --timeout 300)
