#!/bin/sh
# Builds every libFuzzer target with clang and runs each for SECONDS, seeded:
#   decode_batch_fuzzer   vLLM KV event payloads (the captures' payloads)
#   http_request_fuzzer   what clients send the gateway (a few requests)
#   topology_fuzzer       topology files (the examples in deploy/)
#   node_messages_fuzzer  messages between nodes (found from scratch)
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (default 60 each; CI runs them briefly)
# A finding stops the script with the fuzzer's report and a crash-* file.
set -eu
cd "$(dirname "$0")/.."
seconds=${1:-60}
[ $# -gt 0 ] && shift
targets=${*:-decode_batch_fuzzer http_request_fuzzer topology_fuzzer node_messages_fuzzer}
CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLLMGW_FUZZ=ON -DLLMGW_BENCH=OFF >/dev/null
ninja -C build-fuzz $targets

seed() { # seed CORPUS NAME CONTENT
  mkdir -p "$1"
  printf '%b' "$3" > "$1/$2"
}
corpus=build-fuzz/corpus
/usr/bin/python3 scripts/make-fuzz-corpus.py build-fuzz/vllm-captures "$corpus/decode_batch_fuzzer" >/dev/null
c=$corpus/http_request_fuzzer
seed "$c" completion 'POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 45\r\n\r\n{"model": "m", "prompt": "hi", "stream": true}'
seed "$c" chat 'POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 56\r\n\r\n{"model":"m","messages":[{"role":"user","content":"x"}]}'
seed "$c" chunked 'POST /v1/route HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n1a\r\n{"model":"m","prompt":[1]}\r\n0\r\n\r\nGET /healthz HTTP/1.0\r\n\r\n'
seed "$c" pipelined 'GET /metrics HTTP/1.1\r\nHost: a\r\n\r\nGET /v1/models HTTP/1.1\r\nConnection: close, X-A\r\n\r\n'
mkdir -p "$corpus/topology_fuzzer" "$corpus/node_messages_fuzzer"
cp deploy/topology/*.toml deploy/local/*.toml "$corpus/topology_fuzzer/"

for t in $targets; do
  printf '\n-- %s (%s s)\n' "$t" "$seconds"
  log=build-fuzz/$t.log
  # -rss_limit_mb: whatever an input claims, memory stays small.
  if ! ./build-fuzz/tests/fuzz/"$t" -max_total_time="$seconds" -rss_limit_mb=1024 \
      -max_len=65536 -timeout=10 -print_final_stats=1 -artifact_prefix=build-fuzz/"$t"- \
      "$corpus/$t" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "$t: a finding; the input is build-fuzz/$t-*"
    exit 1
  fi
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || true
done
