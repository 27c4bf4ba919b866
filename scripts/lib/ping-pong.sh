# shellcheck shell=bash
# Sourced by the scripts that run rdmabuf's endpoint ping-pong (`rdmabuf
# serve --endpoint` against rdmabuf_ping_pong) beside ucx_perftest:
# ping-pong-rounds.sh, count-instructions.sh and trip-parts.sh. What they
# must do alike, so that each compares the same two things.

# The sourcing script's name as its own messages give it ("ping-pong-rounds").
script_name() {
  local name=${0##*/}
  echo "${name%.sh}"
}

# The first RDMA device's name (Soft-RoCE's rxe0 in scripts/softroce-vm);
# fails, saying so, when there is none.
first_rdma_device() {
  local path
  for path in /sys/class/infiniband/*; do
    [ -e "$path" ] && { echo "${path##*/}"; return 0; }
  done
  echo "$(script_name): no RDMA device (run inside scripts/softroce-vm)" >&2
  return 1
}

# ucx_env_for BACKEND: sets the array ucx_env to the UCX settings
# (NAME=VALUE, for env or export) that run ucx_perftest over the transport
# rdmabuf's BACKEND uses: for ibverbs, rc_verbs on UCX_NET_DEVICES and
# UCX_IB_GID_INDEX where set, else on the first RDMA device's port 1 and
# GID index RDMABUF_IB_GID_INDEX (default 0: UCX sets its reliable
# connections up through ud_verbs, whose datagrams on Soft-RoCE reach the
# peer only over an IPv6 GID); for tcp, tcp; else posix and sysv shared
# memory.
# shellcheck disable=SC2034  # ucx_env is the sourcing script's
ucx_env_for() {
  case $1 in
    ibverbs)
      local device=${UCX_NET_DEVICES:-}
      [ -n "$device" ] || device=$(first_rdma_device):1 || return 1
      ucx_env=("UCX_TLS=rc_verbs,ud_verbs,self" "UCX_NET_DEVICES=$device"
               "UCX_IB_GID_INDEX=${UCX_IB_GID_INDEX:-${RDMABUF_IB_GID_INDEX:-0}}") ;;
    tcp) ucx_env=("UCX_TLS=tcp,self") ;;
    *) ucx_env=("UCX_TLS=posix,sysv,self") ;;
  esac
}

# endpoint_address FILE [SECONDS] [PAUSE]: the address that `rdmabuf serve
# --endpoint`, started with its output into FILE, printed there; looked
# for every 0.1 s for up to SECONDS (default 10), pausing with the command
# PAUSE (default sleep; trip-parts.sh passes one that starts no process).
# Fails, with the server's output on stderr, when none came.
endpoint_address() {
  local served=$1 seconds=${2:-10} pause=${3:-sleep} address
  for _ in $(seq $((seconds * 10))); do
    address=$(awk '$1 == "endpoint" { print $2 }' "$served")
    if [ -n "$address" ]; then
      echo "$address"
      return 0
    fi
    "$pause" 0.1
  done
  echo "$(script_name): rdmabuf serve printed no endpoint address:" >&2
  cat "$served" >&2
  return 1
}
