#!/usr/bin/env bash
# Runs the example's two processes together: `read_write owner`, then
# `read_write reader HANDLE` with the handle the owner printed. Exits 0 when
# the reader printed OK and the owner stopped cleanly.
#
#   run.sh [PATH/TO/read_write]     (default: build/read_write next to this script)
set -euo pipefail

bin=${1:-"$(dirname "${BASH_SOURCE[0]}")/build/read_write"}
if [ ! -x "$bin" ]; then
  echo "run.sh: no executable at $bin" >&2
  exit 1
fi

# The owner's stdin and stdout are pipes to us; it serves until stdin closes.
coproc OWNER { exec "$bin" owner; }
# shellcheck disable=SC2153  # OWNER_PID is set by coproc
owner_pid=$OWNER_PID
owner_in=${OWNER[1]}
trap 'kill "$owner_pid" 2>/dev/null || true' EXIT

if ! read -r -t 30 handle <&"${OWNER[0]}"; then
  echo "run.sh: the owner printed no handle" >&2
  exit 1
fi
echo "owner's handle: $handle"

result=$(timeout 120 "$bin" reader "$handle")
echo "reader: $result"

exec {owner_in}>&-
wait "$owner_pid"
trap - EXIT
[ "$result" = OK ]
