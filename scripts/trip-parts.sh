#!/usr/bin/env bash
# Splits a ping-pong's one-way trip over verbs (SIZE bytes, default 8)
# into the kernel's part and the receiver's, for rdmabuf's endpoint and
# for UCX's tag_lat side by side: where the time between two processes
# goes on Soft-RoCE, which timings alone cannot tell.
#
#   scripts/softroce-vm -- scripts/trip-parts.sh [SIZE] [ROUNDS]
#
# Runs inside scripts/softroce-vm only (as root: it traces the guest's
# kernel), on a tree built on the host. Each round runs `rdmabuf serve
# --endpoint` against rdmabuf_ping_pong, then ucx_perftest -t tag_lat over
# rc_verbs (when installed), and traces each for WINDOW_S seconds (default
# 0.2) in the middle of its run, with no process of this script running
# meanwhile. Two events are traced: write(2) entries of the two processes
# (on Soft-RoCE every ibv_post_send is one: the provider's doorbell), and
# rxe_cq_post (a kprobe): the emulated NIC putting a completion in a
# queue. Between one side's doorbell and the other side's next one:
#   kernel    doorbell -> the first completion after it (the SEND's
#             receive completing at the peer, all inside the sender's
#             system call: rxe loops a local packet back synchronously),
#   reaction  that completion -> the peer's next doorbell: the peer's
#             user space, from seeing the completion (its spin) to
#             posting its answer.
# Prints each window's medians and the share of one-way trips whose two
# processes shared a CPU then; a window with more than 10% of those was
# disturbed (the trace itself, a busy host) and is left out of the
# summary, which gives the medians over the other windows. Tracing costs
# some microseconds a trip in both parts: read them side by side, not as
# absolute figures.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
size=${1:-8}
rounds=${2:-3}
window_s=${WINDOW_S:-0.2}
build=${RDMABUF_BUILD_DIR:-build}
tracing=/sys/kernel/tracing
if [ -z "${SOFTROCE_VM:-}" ]; then
  echo "trip-parts: run inside scripts/softroce-vm: scripts/softroce-vm -- $0 $*" >&2
  exit 2
fi
mountpoint -q "$tracing" || mount -t tracefs nodev "$tracing"
# shellcheck source=scripts/lib/ping-pong.sh
. scripts/lib/ping-pong.sh
device=$(first_rdma_device)
export RDMABUF_IB_GID_INDEX=${RDMABUF_IB_GID_INDEX:-0}  # UCX connects on Soft-RoCE's IPv6 GID only
ucx_env_for ibverbs
out=$(mktemp -d)
pids=()
cleanup() {
  echo 0 >"$tracing/events/enable" 2>/dev/null || true
  echo >"$tracing/kprobe_events" 2>/dev/null || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT

echo 16384 >"$tracing/buffer_size_kb"
# The kprobe as a breakpoint only, registered once, before any verbs
# process runs. Optimized (a jump patched in over the breakpoint, later,
# while rxe may run on the other CPU) it crashed the emulated guest's
# kernel: a call through a null pointer in rxe_cq_post's caller. As
# here it is safer, not safe: it crashed the same way once more, 200 s
# into a run of twelve ping-pongs; softroce-vm's --timeout then ends the
# boot.
echo 0 >/proc/sys/debug/kprobes-optimization
echo 'p:rdmabuf_cq_post rxe_cq_post' >"$tracing/kprobe_events"
# A sleep that starts no process (a timed read of a FIFO nobody writes):
# the window's only processes are the two traced.
mkfifo "$out/idle"
exec 3<>"$out/idle"
idle() { read -r -t "$1" -u 3 || true; }

# Returns once the device sends packets steadily (a ping-pong under way:
# boots differ by minutes in how long processes take to start and
# connect), then waits $1 seconds more for its warm-up to pass.
sent_packets=/sys/class/infiniband/$device/ports/1/hw_counters/sent_pkts
wait_for_trips() {
  local before after
  for _ in $(seq 300); do
    read -r before <"$sent_packets"
    idle 0.2
    read -r after <"$sent_packets"
    [ $((after - before)) -gt 200 ] && break
  done
  idle "$1"
}

# Traces `window_s` seconds of the writes of processes named like $2 into $1.
trace_window() {
  echo >"$tracing/trace"
  echo "comm ~ \"$2\"" >"$tracing/events/syscalls/sys_enter_write/filter"
  echo 1 >"$tracing/events/syscalls/sys_enter_write/enable"
  echo 1 >"$tracing/events/kprobes/rdmabuf_cq_post/enable"
  idle "$window_s"
  echo 0 >"$tracing/events/kprobes/rdmabuf_cq_post/enable"
  echo 0 >"$tracing/events/syscalls/sys_enter_write/enable"
  cp "$tracing/trace" "$1"
}

# Waits for the last run's client to finish its trips, then stops its
# server (rdmabuf serve ends on SIGINT; ucx_perftest's ends with its
# client). Neither is killed in the middle of its trips: that once locked
# up the guest's kernel (both CPUs, for minutes).
finish_run() {  # $1: the server's pid, $2: the client's
  wait "$2" 2>/dev/null || true
  kill -INT "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  pids=()
}

run_rdmabuf() {  # $1: trace file
  RDMABUF_BACKENDS=ibverbs "$build/tools/rdmabuf" serve --size "$size" --pattern zero \
    --endpoint >"$out/served" 2>&1 &
  pids+=($!)
  local address
  address=$(endpoint_address "$out/served" 20 idle) || return 1
  # 60000 trips: 4 to 13 s in the VM's boots, so that the window falls
  # inside the measured ones (as 60000 iterations do for UCX below).
  RDMABUF_BACKENDS=ibverbs "$build/tools/rdmabuf_ping_pong" "$address" "$size" 60000 \
    >/dev/null 2>&1 &
  pids+=($!)
  wait_for_trips 1  # past the warm-up's 1000 trips
  trace_window "$1" 'rdmabuf*'
  finish_run "${pids[0]}" "${pids[1]}"
}

run_ucx() {  # $1: trace file
  local port=$((20000 + RANDOM % 20000))
  export "${ucx_env[@]}"
  ucx_perftest -p "$port" -t tag_lat -s "$size" -n 60000 >/dev/null 2>&1 &
  pids+=($!)
  idle 1.5
  ucx_perftest -p "$port" localhost -t tag_lat -s "$size" -n 60000 >/dev/null 2>&1 &
  pids+=($!)
  wait_for_trips 3  # past the warm-up's 10000 iterations
  trace_window "$1" 'ucx_perftest'
  finish_run "${pids[0]}" "${pids[1]}"
  unset "${ucx_env[@]%%=*}"
}

for round in $(seq "$rounds"); do
  run_rdmabuf "$out/rdmabuf.$round"
  if command -v ucx_perftest >/dev/null; then run_ucx "$out/ucx.$round"; fi
done

/usr/bin/python3 - "$out" "$rounds" <<'EOF'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
event = re.compile(r'-(\d+)\s+\[(\d+)\].*?\s([\d.]+): (sys_write|rdmabuf_cq_post)')

def parts(path):
    """One-way trips: (total, kernel, reaction, shared cpu) in microseconds."""
    events = []
    for line in open(path):
        m = event.search(line)
        if m:
            pid, cpu, t, kind = m.groups()
            events.append((float(t) * 1e6, kind, pid, cpu))
    writes = [e for e in events if e[1] == 'sys_write']
    # The two processes that ring doorbells most: the ping-pong's two sides.
    sides = sorted({e[2] for e in writes}, key=lambda p: -sum(e[2] == p for e in writes))[:2]
    trips, last, post = [], None, None
    for e in events:
        if e[1] == 'rdmabuf_cq_post':
            if last and post is None: post = e[0]
            continue
        if e[2] not in sides: continue
        if last and last[2] != e[2] and post is not None:
            trips.append((e[0] - last[0], post - last[0], e[0] - post, e[3] == last[3]))
        last, post = e, None
    return trips

def median(values):
    return statistics.median(values) if values else float('nan')

summary = {}
for system in ('rdmabuf', 'ucx'):
    for r in range(1, rounds + 1):
        try:
            trips = parts(f'{out}/{system}.{r}')
        except FileNotFoundError:
            continue
        if not trips:  # the run ended before the window, or had not begun
            print(f'{system:8s} round {r}: no one-way trips in the window (left out)')
            continue
        shared = sum(t[3] for t in trips) / len(trips)
        clean = shared <= 0.10
        print(f'{system:8s} round {r}: {len(trips):5d} one-way trips, one way {median([t[0] for t in trips]):6.1f} us'
              f' = kernel {median([t[1] for t in trips]):6.1f} + reaction {median([t[2] for t in trips]):6.1f};'
              f' sharing a CPU {100 * shared:3.0f}%{"" if clean else " (left out)"}')
        if clean: summary.setdefault(system, []).append(trips)
print()
for system, windows in summary.items():
    k = median([median([t[1] for t in w]) for w in windows])
    r = median([median([t[2] for t in w]) for w in windows])
    print(f'{system:8s} over {len(windows)} window(s): kernel {k:6.1f} us, reaction {r:6.1f} us (medians of the windows\' medians)')
EOF
