#!/usr/bin/env bash
# Counts the library's instructions per message round trip on the client of
# an endpoint ping-pong, under valgrind's callgrind: a figure that stays put
# to a percent or two on a machine whose timings move by 30%.
#
#   scripts/count-instructions.sh [SIZE] [TRIPS] [BACKENDS]
#
# SIZE bytes per message (default 8), TRIPS round trips (default 20000),
# BACKENDS for both sides (RDMABUF_BACKENDS; default memory, whose
# endpoints' frames travel through shared memory; tcp for a TCP channel).
# Starts `rdmabuf serve --endpoint` (natively), runs rdmabuf_ping_pong
# under callgrind against it, and prints the inclusive instructions of
# Endpoint::post_receive, Endpoint::send and PendingReceive::wait, per
# round trip. Under callgrind the client is so slow that the server always
# answers before it looks, so the count is work, not spinning. Keep the
# machine otherwise idle: a server that falls behind makes the client spin,
# which counts. The profile stays in BUILD/callgrind.ping_pong.out for
# callgrind_annotate (valgrind's own messages in callgrind.ping_pong.log).
# See docs/performance.md.
#
# RDMABUF_BUILD_DIR as in setup.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
size=${1:-8}
trips=${2:-20000}
backends=${3:-memory}
scripts/install-packages.sh valgrind
scripts/setup.sh >&2
build=${RDMABUF_BUILD_DIR:-build}

served=$(mktemp)
RDMABUF_BACKENDS=$backends "$build/tools/rdmabuf" serve --size "$size" --pattern zero \
  --endpoint >"$served" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$served"' EXIT
address=
for _ in $(seq 50); do
  address=$(awk '$1 == "endpoint" { print $2 }' "$served")
  [ -n "$address" ] && break
  sleep 0.1
done
if [ -z "$address" ]; then
  echo "count-instructions: the server printed no endpoint address:" >&2
  cat "$served" >&2
  exit 1
fi

out=$build/callgrind.ping_pong.out
# Counted: only the measured trips (not the warm-up's, not start-up), with
# every symbol bound at load (no lazy binding inside the first calls).
LD_BIND_NOW=1 RDMABUF_BACKENDS=$backends valgrind --tool=callgrind --callgrind-out-file="$out" \
  --log-file="$build/callgrind.ping_pong.log" \
  --toggle-collect='*measured_round_trips*' \
  "$build/tools/rdmabuf_ping_pong" "$address" "$size" "$trips" | grep -v "^median"
callgrind_annotate --inclusive=yes "$out" 2>/dev/null |
  awk -v trips="$trips" '
    match($0, /endpoint\.cc:rdmabuf::(PendingReceive::wait|Endpoint::send|Endpoint::post_receive)\(/) {
      name = substr($0, RSTART + length("endpoint.cc:rdmabuf::"))
      sub(/\(.*/, "", name)
      if (name in seen) next  # a function once: its own line, not its inlined parts
      seen[name] = 1
      ir = $1; gsub(",", "", ir)
      printf "%-26s %6d\n", name, ir / trips
      total += ir
    }
    END { printf "%-26s %6d instructions per round trip\n", "library", total / trips }'
