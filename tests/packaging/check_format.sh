#!/usr/bin/env bash
# Fails when a C++ file (*.h, *.cc) in the tree is not formatted as the
# project's .clang-format says. Fix with: clang-format -i FILE...
# Formatting differs between clang-format releases; the project follows the
# one Debian 12 ships (clang-format 14), which scripts/setup.sh installs.
#
#   check_format.sh [CLANG_FORMAT]     (default: clang-format on the PATH)
# Exits 77 (CTest: skipped) when clang-format is not installed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
clang_format=${1:-clang-format}
if ! command -v "$clang_format" >/dev/null 2>&1; then
  echo "format: SKIPPED: $clang_format not found (scripts/setup.sh installs it)"
  exit 77
fi

# Tracked and untracked-but-not-ignored files; every file when not in git.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.h' '*.cc')
else
  mapfile -t files < <(find . -path './build*' -prune -o -type f \( -name '*.h' -o -name '*.cc' \) -print)
fi
existing=()
for f in "${files[@]}"; do
  [ -f "$f" ] && existing+=("$f")
done
if [ ${#existing[@]} -eq 0 ]; then
  echo "format: no C++ files found" >&2
  exit 1
fi

if ! "$clang_format" --dry-run --Werror "${existing[@]}"; then
  echo "format: FAILED: run clang-format -i on the files above" >&2
  exit 1
fi
echo "format: OK (${#existing[@]} files, $("$clang_format" --version))"
