#!/bin/sh
# Fails if any tracked C++ file differs from what clang-format (Debian's,
# with .clang-format) would write. Fix with: scripts/check-format.sh --fix
set -eu
cd "$(dirname "$0")/.."
files=$(git ls-files --cached --others --exclude-standard '*.cpp' '*.hpp')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i $files
  exit 0
fi
clang-format --dry-run --Werror $files
echo "clang-format: $(echo "$files" | wc -l) files clean"
