#!/bin/sh
# clang-tidy (.clang-tidy) over llmgw's own sources, warnings as errors.
#   scripts/tidy.sh BUILD_DIR    (a configured build with compile_commands.json)
set -eu
cd "$(dirname "$0")/.."
build=${1:-build-release}
files=$(git ls-files 'base/*.cpp' 'wire/*.cpp' 'config/*.cpp' 'kv/*.cpp' 'routing/*.cpp' 'net/*.cpp' \
  'messages/*.cpp' 'actors/*.cpp' 'gateway/*.cpp' 'apps/*.cpp')
log=$(mktemp)
if ! clang-tidy -p "$build" --quiet --warnings-as-errors='*' $files >"$log" 2>&1; then
  grep -v "warnings generated" "$log"
  rm -f "$log"
  exit 1
fi
rm -f "$log"
echo "clang-tidy: $(echo "$files" | wc -w) files clean"
