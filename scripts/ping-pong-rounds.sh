#!/usr/bin/env bash
# Interleaved ping-pong rounds: rdmabuf's endpoint (rdmabuf_ping_pong
# against `rdmabuf serve --endpoint`, fresh processes each time) beside
# ucx_perftest -t tag_lat over the same transport, round after round, and
# the medians over the rounds. Where one launch differs from the next by
# 20-30% (the Soft-RoCE VM), one run decides nothing; twenty rounds show
# a gap of a tenth.
#
#   scripts/ping-pong-rounds.sh [--backend B] [--rounds N] [--trips N] [--size S]
#                               [--no-ucx] [NAME=LIBDIR ...]
#
# --backend   both sides' RDMABUF_BACKENDS (default ibverbs inside
#             scripts/softroce-vm, memory elsewhere); UCX runs over rc_verbs,
#             posix shared memory or tcp to match
# --rounds    rounds (default 10); --trips: round trips a run (default 5000,
#             after rdmabuf_ping_pong's 1000 and UCX's own warm-up); --size:
#             bytes a message (default 8)
# NAME=LIBDIR another build of the library to run in each round beside the
#             tree's (`cur`): a directory holding its librdmabuf.so.0 (copy
#             build/librdmabuf.so.0.1.0 there), picked by LD_LIBRARY_PATH.
#             A build's position in the round is not neutral: list the
#             builds in both orders across boots.
#
# Prints each run's line as it ends, then per system the median of the
# rounds' medians (µs one way) and, beside UCX, the median and range of the
# rounds' own ratios (UCX's figure over the build's: above 1, rdmabuf is
# faster). UCX's figure is tag_lat's "typical" latency.
#
# Inside the VM, on a tree built on the host:
#   scripts/softroce-vm --timeout 900 -- scripts/ping-pong-rounds.sh --rounds 20
# (RDMABUF_IB_GID_INDEX defaults to 0 there: UCX connects on Soft-RoCE's
# IPv6 GID only.) RDMABUF_BUILD_DIR as in setup.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${RDMABUF_BUILD_DIR:-build}
backend=memory
[ -n "${SOFTROCE_VM:-}" ] && backend=ibverbs
rounds=10
trips=5000
size=8
ucx=1
builds=(cur=)
while [ $# -gt 0 ]; do
  case $1 in
    --backend) backend=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --trips) trips=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --no-ucx) ucx=; shift ;;
    *=*) builds+=("$1"); shift ;;
    *) echo "ping-pong-rounds: unknown argument $1 (see the script's header)" >&2; exit 2 ;;
  esac
done
for tool in "$build/tools/rdmabuf" "$build/tools/rdmabuf_ping_pong"; do
  [ -x "$tool" ] || { echo "ping-pong-rounds: $tool not built (scripts/setup.sh)" >&2; exit 1; }
done
# shellcheck source=scripts/lib/ping-pong.sh
. scripts/lib/ping-pong.sh
if [ "$backend" = ibverbs ]; then
  export RDMABUF_IB_GID_INDEX=${RDMABUF_IB_GID_INDEX:-0}  # UCX connects on Soft-RoCE's IPv6 GID only
fi
ucx_env_for "$backend" || exit 1
if [ -n "$ucx" ] && ! command -v ucx_perftest >/dev/null; then
  echo "ping-pong-rounds: ucx_perftest not found (install ucx-utils); rdmabuf alone"
  ucx=
fi

results=$(mktemp)
trap 'rm -f "$results" "$results".*' EXIT

# The runs below each go in a command substitution's subshell: each stops
# its own server when that subshell exits, however it exits.

# One rdmabuf run with the library in $1 (empty: the tree's): its median.
rdmabuf_run() {
  local lib=$1 served="$results.served" address='' out
  LD_LIBRARY_PATH=$lib RDMABUF_BACKENDS=$backend "$build/tools/rdmabuf" serve --size "$size" \
    --pattern zero --endpoint >"$served" 2>&1 &
  local server=$!
  # Expanded now: the subshell exits after this function's locals are gone.
  # shellcheck disable=SC2064
  trap "kill $server 2>/dev/null || true; wait $server 2>/dev/null || true" EXIT
  address=$(endpoint_address "$served") || return 1
  out=$(LD_LIBRARY_PATH=$lib RDMABUF_BACKENDS=$backend "$build/tools/rdmabuf_ping_pong" \
    "$address" "$size" "$trips")
  awk '/^median one way/ { print $4 }' <<<"$out"
}

# One ucx_perftest tag_lat run: its typical one-way latency (empty when it
# failed; a side that cannot connect gives up within 120 s).
ucx_run() {
  local port=$((20000 + RANDOM % 20000)) line
  env "${ucx_env[@]}" timeout 120 ucx_perftest -p "$port" -t tag_lat -s "$size" -n "$trips" \
    >/dev/null 2>&1 &
  local server=$!
  sleep 1
  line=$(env "${ucx_env[@]}" timeout 120 ucx_perftest -p "$port" 127.0.0.1 -t tag_lat -s "$size" \
    -n "$trips" 2>&1 | awk '$1 == "Final:" { print $3 }')
  wait "$server" 2>/dev/null || true
  echo "$line"
}

for round in $(seq "$rounds"); do
  for entry in "${builds[@]}"; do
    name=${entry%%=*}
    median=$(rdmabuf_run "${entry#*=}" || true)
    if [ -n "$median" ]; then
      echo "round $round $name $median"
      echo "$round $name $median" >>"$results"
    else
      echo "round $round $name failed"
    fi
  done
  if [ -n "$ucx" ]; then
    typical=$(ucx_run)
    if [ -n "$typical" ]; then
      echo "round $round UCX $typical"
      echo "$round UCX $typical" >>"$results"
    else
      echo "round $round UCX failed"
    fi
  fi
done

echo "$backend, $size B, $trips trips a run, $rounds rounds: µs one way"
awk -v rounds="$rounds" '
  function median(list, n,    sorted, i, j, t) {
    for (i = 1; i <= n; ++i) sorted[i] = list[i]
    for (i = 2; i <= n; ++i)  # insertion sort: a few dozen values
      for (j = i; j > 1 && sorted[j - 1] > sorted[j]; --j) {
        t = sorted[j]; sorted[j] = sorted[j - 1]; sorted[j - 1] = t
      }
    return n % 2 ? sorted[(n + 1) / 2] : (sorted[n / 2] + sorted[n / 2 + 1]) / 2
  }
  { us[$2, ++count[$2]] = $3; of[$1, $2] = $3; if (!($2 in seen)) { seen[$2] = 1; order[++names] = $2 } }
  END {
    for (k = 1; k <= names; ++k) {
      name = order[k]
      n = count[name]
      for (i = 1; i <= n; ++i) values[i] = us[name, i]
      line = sprintf("%-8s median %8.2f", name, median(values, n))
      if (name != "UCX" && ("UCX" in seen)) {
        m = 0; lo = ""; hi = ""
        for (round = 1; round <= rounds; ++round) {  # a failed run left no line
          if (!((round, "UCX") in of) || !((round, name) in of)) continue
          r = of[round, "UCX"] / of[round, name]
          ratios[++m] = r
          if (lo == "" || r < lo) lo = r
          if (hi == "" || r > hi) hi = r
        }
        if (m > 0) line = line sprintf("   x UCX %.2f (rounds %.2f-%.2f)", median(ratios, m), lo, hi)
      }
      print line
    }
  }' "$results"
