#!/usr/bin/env bash
# Formats the C and C++ sources of moe-mlir with clang-format (LLVM style,
# .clang-format), or with --check lists the files that are not formatted and
# exits 1. Uses LLVM 22's clang-format (scripts/setup.sh installs it), so
# every machine formats alike.
#   scripts/format.sh           # format in place
#   scripts/format.sh --check   # check only (the test suite runs this)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cf=${CLANG_FORMAT:-/usr/lib/llvm-22/bin/clang-format}
if [ ! -x "$cf" ]; then
  echo "format: $cf not found (scripts/setup.sh installs clang-format-22)" >&2
  exit 2
fi
cd "$root"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -co --exclude-standard -- '*.c' '*.cpp' '*.h' |
                        while read -r f; do [ -f "$f" ] && echo "$f"; done)
else
  mapfile -t files < <(find include lib tools runtime python/src test -name '*.c' -o \
                        -name '*.cpp' -o -name '*.h' | sort)
fi
case "${1:-}" in
  --check)
    bad=()
    for f in "${files[@]}"; do
      "$cf" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    done
    if ((${#bad[@]})); then
      echo "format: ${#bad[@]} of ${#files[@]} files are not clang-formatted" \
           "(run scripts/format.sh):"
      printf '  %s\n' "${bad[@]}"
      exit 1
    fi
    echo "format: ${#files[@]} files clang-formatted"
    ;;
  "") "$cf" -i "${files[@]}" ;;
  *) echo "usage: scripts/format.sh [--check]" >&2; exit 2 ;;
esac
