#!/usr/bin/env bash
# Fails when an #include crosses the layers the wrong way (docs/development.md,
# "Layering"): common/ includes nothing from backends/ or core/; backends/
# includes nothing from core/; the public headers in include/rdmabuf/
# include only system headers (<...>) and other public headers
# ("rdmabuf/...").
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

# Tracked and untracked-but-not-ignored files; every file when not in git.
files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -- "$@"
  else
    find "$@" -type f 2>/dev/null
  fi
}

include_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*'
bad=0

# check DIR PATTERN WHAT [ALLOWED]: an include in DIR that matches PATTERN
# (and not ALLOWED) is a violation.
check() {
  local dir=$1 pattern=$2 what=$3 allowed=${4:-} hits rc=0
  mapfile -t sources < <(files "$dir" | while read -r f; do [ -f "$f" ] && echo "$f"; done)
  [ ${#sources[@]} -gt 0 ] || return 0
  hits=$(grep -nHE "$include_re$pattern" "${sources[@]}") || rc=$?
  [ "$rc" -le 1 ] || exit 2  # grep itself failed (and said why)
  if [ -n "$allowed" ] && [ -n "$hits" ]; then
    # grep -n output is FILE:LINE:TEXT
    hits=$(grep -vE "^[^:]*:[0-9]+:${include_re#^}$allowed" <<<"$hits" || true)
  fi
  if [ -n "$hits" ]; then
    echo "$what:" >&2
    sed 's/^/  /' <<<"$hits" >&2
    bad=1
  fi
}

check common/ '["<](backends|core|tools)/' "common/ must not include backends/, core/ or tools/"
check backends/ '["<](core|tools)/' "backends/ must not include core/ or tools/"
check core/ '["<]tools/' "core/ must not include tools/"
check include/rdmabuf/ '("|<(common|core|backends|tools)/)' \
  'include/rdmabuf/ may include only <system> headers and "rdmabuf/..."' '"rdmabuf/'

if [ "$bad" -ne 0 ]; then
  echo "layering: FAILED (see docs/development.md)" >&2
  exit 1
fi
echo "layering: OK"
