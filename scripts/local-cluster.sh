#!/bin/sh
# The local cluster on a fresh Debian 12 machine, as root: installs the
# dependencies, builds llmgw and llmgw-sim, and runs deploy/local/cluster.toml
# (one control node, two agent nodes, four simulated vLLM engines) with the
# demo traffic; it keeps serving at http://127.0.0.1:8080 until Ctrl-C.
set -eu
cd "$(dirname "$0")/.."
echo "==== dependencies"
./scripts/install-deps.sh >/tmp/llmgw-install-deps.log 2>&1 || {
  cat /tmp/llmgw-install-deps.log; exit 1; }
echo "==== build"
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build-release llmgw llmgw-sim
echo "==== the local cluster"
exec ./build-release/apps/llmgw up --config deploy/local/cluster.toml --demo "$@"
