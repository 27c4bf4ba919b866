#!/usr/bin/env bash
# The ctest test ibverbs_in_softroce_vm: the ibverbs conformance and
# integration tests, on real verbs, inside scripts/softroce-vm (a QEMU guest
# with a Soft-RoCE device), since this machine may have no RDMA NIC.
#
#   run_ibverbs_tests.sh CONFORMANCE_TESTS INTEGRATION_TESTS BUILD_DIR
#
# Exit 125 (ctest: skipped) when RDMABUF_SOFTROCE=0, or when the VM cannot be
# set up on this machine (softroce-vm says why); otherwise the tests' status.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 CONFORMANCE_TESTS INTEGRATION_TESTS BUILD_DIR" >&2; exit 2; }
conformance=$1 integration=$2 build_dir=$3
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

if [ "${RDMABUF_SOFTROCE:-1}" = 0 ]; then
  echo "skipped: RDMABUF_SOFTROCE=0 (the ibverbs tests need the Soft-RoCE VM)"
  exit 125
fi

# Emulated CPUs: the whole run takes about a minute once the VM is cached.
# The guest writes nothing but test output; gtest's own skips (none are
# expected in the VM) would show in it.
status=0
"$repo/scripts/softroce-vm" --timeout 1500 --share "$build_dir" -- \
  sh -c '"$1" --gtest_filter="*/ibverbs" && "$2" --gtest_filter="Ibverbs*"' \
  sh "$conformance" "$integration" || status=$?
if [ "$status" = 125 ]; then
  echo "skipped: the Soft-RoCE VM cannot be set up on this machine (see above)"
fi
exit "$status"
