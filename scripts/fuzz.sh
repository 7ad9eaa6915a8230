#!/bin/sh
# Builds the decoder's libFuzzer target with clang and runs it, seeded with
# every payload of the captures.
#   scripts/fuzz.sh [SECONDS]     (default 60; CI runs it briefly)
set -eu
cd "$(dirname "$0")/.."
seconds=${1:-60}
shared=${LLMGW_SHARED_DIR:-$(cd .. && pwd)/shared}
CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLLMGW_FUZZ=ON -DLLMGW_BENCH=OFF -DLLMGW_SHARED_DIR="$shared" >/dev/null
ninja -C build-fuzz decode_batch_fuzzer
corpus=build-fuzz/corpus
/usr/bin/python3 scripts/make-fuzz-corpus.py "$shared" "$corpus"
# -rss_limit_mb: the decoder must stay small whatever the input claims.
./build-fuzz/tests/fuzz/decode_batch_fuzzer -max_total_time="$seconds" -rss_limit_mb=512 \
  -max_len=65536 -print_final_stats=1 "$corpus"
