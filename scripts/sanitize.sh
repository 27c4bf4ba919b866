#!/usr/bin/env bash
# The whole test suite again under the sanitizers, each in a build directory
# of its own: ASan+UBSan (build-asan), then TSan (build-tsan). Any report
# fails the test that caused it (UBSan does not recover; ASan and TSan exit
# non-zero), and so this script.
#
#   scripts/sanitize.sh [address|thread]...   (default: both)
#
# Extra ctest arguments go in RDMABUF_CTEST_ARGS. The Python package is not
# built with sanitizers (an instrumented extension would need an
# instrumented interpreter); its tests run in the normal build only.
#
# Left out here, run in the normal build (set RDMABUF_SANITIZE_ALL=1 to run
# them all):
# - the conformance suites' GPU cases (ConformanceTest, RangesTest) with
#   GPU memory on one side only: here they run with GPU memory on both
#   sides (`*_gpu_both`: staging on the reader's side, the owner's staging
#   ring, CUDA IPC). One-sided ones add 2.5 minutes under TSan and 1 under
#   ASan and take no code path of their own that gpu_both and the host
#   cases do not.
# - the conformance suites over same-host memory that is not in a shared file
#   (`memory_private_host`): that kernel copy path runs here in the release
#   race and stopped-writer tests, and in every test that registers memory
#   it did not allocate.
# - conformance_across_hosts: the tcp cases again with the owner in another
#   network namespace; the same code runs here in the tcp cases themselves.
# - bench_compare_short (a minute, alone): it checks the report's shape
#   beside the peers' tools, whose code is not ours.
# - bench_send_rounds_* (benchmarks of a few rounds: mostly process start
#   under a sanitizer) and install_and_consume (packaging: cmake --install
#   and a consumer's build); under TSan also bench_json_* (47 s there; the
#   ASan pass runs them).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(address thread)

# halt_on_error: the first report ends the process, so the test fails at the
# report, not at some later symptom. Peers and readers the tests spawn
# inherit these.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

for kind in "${kinds[@]}"; do
  case "$kind" in
    address) dir=build-asan ;;
    thread) dir=build-tsan ;;
    *) echo "sanitize.sh: unknown sanitizer '$kind' (address or thread)" >&2; exit 2 ;;
  esac
  echo "sanitize.sh: the test suite under RDMABUF_SANITIZE=$kind in $dir"
  slow='bench_compare_short|conformance_across_hosts|bench_send_rounds_[a-z]+|install_and_consume'
  [ "$kind" = thread ] && slow+='|bench_json_[a-z]+'
  left_out=(-E "^(Gpu/(Conformance|Ranges)Test\.[A-Za-z]+/[a-z]+_gpu_(local|remote)|Backends/(Conformance|Ranges)Test\.[A-Za-z]+/memory_private_host|$slow)( |\$)")
  [ "${RDMABUF_SANITIZE_ALL:-0}" = 1 ] && left_out=()
  # shellcheck disable=SC2086  # word splitting of extra arguments is intended
  RDMABUF_BUILD_DIR=$dir RDMABUF_CMAKE_ARGS="-DRDMABUF_SANITIZE=$kind -DRDMABUF_BUILD_PYTHON=OFF" \
    scripts/test.sh "${left_out[@]}" ${RDMABUF_CTEST_ARGS:-}
done
