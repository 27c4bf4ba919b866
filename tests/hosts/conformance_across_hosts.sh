#!/usr/bin/env bash
# The ctest test conformance_across_hosts: the conformance suite's tcp
# cases (host memory, and GPU memory on both sides) with the reader on one
# host and the owner's manager on another (scripts/netns_hosts.py: network,
# PID, UTS and mount namespaces of their own, joined by a virtual link), so
# that every byte crosses the link. The owner's manager is made on a thread
# of the test process that joined the other host's network namespace
# (RDMABUF_TEST_OWNER_NETNS, tests/conformance/fixture.h): the suite keeps
# both managers in one process, so they share a PID namespace; the few
# tests that make an owner of their own run it beside the reader.
#
#   conformance_across_hosts.sh CONFORMANCE_TESTS
#
# Exit 125 (ctest: skipped) when namespaces cannot be made here (not root),
# unless RDMABUF_TEST_STRICT=1 (as CI sets it): then that fails.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
hosts="$repo/scripts/netns_hosts.py"

if [ "${1:-}" != "--inside" ]; then
  [ $# -eq 1 ] || { echo "usage: $0 CONFORMANCE_TESTS" >&2; exit 2; }
  if ! unshare --net true 2>/dev/null; then
    echo "cannot make network namespaces here (needs root or CAP_SYS_ADMIN)"
    [ "${RDMABUF_TEST_STRICT:-0}" = 1 ] && exit 1
    exit 125
  fi
  exec "$hosts" run --count 2 -- "$0" --inside "$1"
fi
# Inside `run`: the reader on h0, the owner in h1's network namespace, as
# h0's processes see it (through the machine's /proc, bound in each host).
conformance=$2
state=${RDMABUF_NETNS_HOSTS%%;*}
h1_pid=${RDMABUF_NETNS_HOSTS##*h1=*@}
h1_pid=${h1_pid%%,*}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$hosts" exec h0 -- env RDMABUF_TEST_OWNER_NETNS="$state/root-proc/$h1_pid/ns/net" \
  RDMABUF_TEST_REQUIRE_BACKENDS=tcp "$conformance" --gtest_filter='*/tcp:*/tcp_gpu_both' |
  tee "$log"
# A filter that matched nothing would pass having tested nothing.
grep -qE '^\[  PASSED  \] [1-9][0-9]+ tests' "$log" ||
  { echo "conformance_across_hosts: fewer than 10 tests passed" >&2; exit 1; }
