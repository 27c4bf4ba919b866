#!/usr/bin/env bash
# Counts the library's instructions per message round trip on the client of
# an endpoint ping-pong, under valgrind's callgrind: a figure that stays put
# to a percent or two on a machine whose timings move by 30%.
#
#   scripts/count-instructions.sh [SIZE] [TRIPS] [BACKENDS]
#
# SIZE bytes per message (default 8), TRIPS round trips (default 20000),
# BACKENDS for both sides (RDMABUF_BACKENDS; default memory, whose
# endpoints' frames travel through shared memory; tcp for a TCP channel;
# ibverbs, inside scripts/softroce-vm once built here (it does not build
# there), for verbs SEND/RECV: the kernel's share of the work, moving the
# packets, is not counted, the user space's is, libibverbs' and the
# provider's included).
# Starts `rdmabuf serve --endpoint` (natively), runs rdmabuf_ping_pong
# under callgrind against it, and prints the inclusive instructions of
# Endpoint::post_receive, Endpoint::send and PendingReceive::wait, per
# round trip, and the client's whole count per round trip (its own loop
# included, as UCX's below is). Under callgrind the client is so slow that
# the server nearly always answers before it looks, so the count is work,
# not spinning. Keep the machine otherwise idle: a server that falls
# behind makes the client spin, which counts (on a host that steals CPU
# time from the server, the wait's count moves by up to a fifth between
# runs; send's and post_receive's do not). The profile stays in
# BUILD/callgrind.ping_pong.out for callgrind_annotate (valgrind's own
# messages in callgrind.ping_pong.log).
#
# Beside it, the peer's figure from the same run: ucx_perftest -t tag_lat
# over the same transport (posix,sysv for memory, tcp for tcp), its client
# under callgrind against a native server, when ucx-utils is installed.
# UCX has no hook to count only its measured iterations, so it runs twice,
# with TRIPS and 3 x TRIPS iterations, and the difference over 2 x TRIPS is
# its steady-state count per round trip (set-up and warm-up cancel out).
# See docs/performance.md.
#
# RDMABUF_BUILD_DIR as in setup.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
size=${1:-8}
trips=${2:-20000}
backends=${3:-memory}
# Inside scripts/softroce-vm the tree is this machine's, built already:
# building again there, under an emulated CPU, would take many minutes and
# rewrite the build the host may be using.
if [ -z "${SOFTROCE_VM:-}" ]; then
  scripts/install-packages.sh valgrind
  scripts/setup.sh >&2
fi
build=${RDMABUF_BUILD_DIR:-build}

served=$(mktemp)
RDMABUF_BACKENDS=$backends "$build/tools/rdmabuf" serve --size "$size" --pattern zero \
  --endpoint >"$served" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$served"' EXIT
# shellcheck source=scripts/lib/ping-pong.sh
. scripts/lib/ping-pong.sh
address=$(endpoint_address "$served")

out=$build/callgrind.ping_pong.out
# Counted: only the measured trips (not the warm-up's, not start-up), with
# every symbol bound at load (no lazy binding inside the first calls).
LD_BIND_NOW=1 RDMABUF_BACKENDS=$backends valgrind --tool=callgrind --callgrind-out-file="$out" \
  --log-file="$build/callgrind.ping_pong.log" \
  --toggle-collect='*measured_round_trips*' \
  "$build/tools/rdmabuf_ping_pong" "$address" "$size" "$trips" | grep -v -e "^median" -e "^p90" -e "^p1 "
annotated=$(callgrind_annotate --inclusive=yes "$out" 2>/dev/null)
counts=$(awk -v trips="$trips" '
    match($0, /endpoint\.cc:rdmabuf::(PendingReceive::wait|Endpoint::send|Endpoint::post_receive)\(/) {
      name = substr($0, RSTART + length("endpoint.cc:rdmabuf::"))
      sub(/\(.*/, "", name)
      if (name in seen) next  # a function once: its own line, not its inlined parts
      seen[name] = 1
      ir = $1; gsub(",", "", ir)
      printf "%-26s %6d\n", name, ir / trips
      total += ir
    }
    END { printf "%-26s %6d instructions per round trip\n", "library", total / trips }' <<<"$annotated")
echo "$counts"
rdmabuf_count=$(awk '$1 == "library" { print $2 }' <<<"$counts")
# All of the measured trips, the tool's own loop (the clock, its queue of
# posted receives) and what it calls outside those three (moving and
# dropping a PendingReceive) included: what ucx_perftest's count is.
client_count=$(awk -v trips="$trips" \
  '/PROGRAM TOTALS/ { ir = $1; gsub(",", "", ir); printf "%d", ir / trips }' <<<"$annotated")
printf "%-26s %6d instructions per round trip (all of it)\n" client "$client_count"

if ! command -v ucx_perftest >/dev/null; then
  echo "(ucx_perftest not found: install ucx-utils to see UCX's count beside)"
  exit 0
fi
ucx_env_for "$backends"
# The instructions of one ucx_perftest tag_lat client of $1 iterations.
ucx_instructions() {
  local n=$1 port=$((20000 + RANDOM % 20000))
  env "${ucx_env[@]}" ucx_perftest -p "$port" -t tag_lat -s "$size" -n "$n" >/dev/null 2>&1 &
  local ucx_server=$!
  sleep 1
  env "${ucx_env[@]}" valgrind --tool=callgrind --callgrind-out-file="$build/callgrind.ucx.$n.out" \
    --log-file="$build/callgrind.ucx.$n.log" ucx_perftest -p "$port" localhost -t tag_lat \
    -s "$size" -n "$n" >/dev/null 2>&1 || { kill $ucx_server 2>/dev/null; return 1; }
  wait $ucx_server || true
  awk '/Collected :/ { print $NF }' "$build/callgrind.ucx.$n.log"
}
if ! short=$(ucx_instructions "$trips") || ! long=$(ucx_instructions $((3 * trips))); then
  echo "count-instructions: ucx_perftest failed (see $build/callgrind.ucx.*.log)" >&2
  exit 1
fi
ucx_count=$(((long - short) / (2 * trips)))
awk -v r="$rdmabuf_count" -v c="$client_count" -v u="$ucx_count" -v tls="${ucx_env[0]#UCX_TLS=}" 'BEGIN {
  printf "%-26s %6d instructions per round trip (ucx_perftest tag_lat, UCX_TLS=%s)\n", "UCX", u, tls
  printf "x (UCX / rdmabuf, above 1: rdmabuf does less) %.2f library, %.2f whole client\n", u / r, u / c }'
