#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan into
# build-fuzz/, then runs each over its seed corpus (fuzz/corpus/<target>/)
# for SECONDS_PER_TARGET seconds (default 30), one after the other.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
#   RDMABUF_FUZZ_TARGETS="fuzz_handle fuzz_hello" scripts/fuzz.sh 60
#
# Exits 1 when any target crashes, hangs, leaks, breaks one of its
# invariants or gets a sanitizer report; the log's tail is printed, with
# the input that did it (a reproducer: build-fuzz/fuzz/<target> FILE).
# Installs the Debian packages it needs first (only the missing ones).
# Inputs the fuzzers find go to build-fuzz/fuzz-corpus/<target>/, kept
# between runs (never committed); the seeds are only read.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-30}
build_dir=${RDMABUF_FUZZ_BUILD_DIR:-build-fuzz}
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]" >&2
  exit 2
fi

# clang 14 is Debian 12's clang; its libFuzzer (libclang_rt.fuzzer) is in
# libclang-rt-14-dev, which clang only recommends. libibverbs-dev: the
# verbs header the ibverbs control frames need.
scripts/install-packages.sh clang libclang-rt-14-dev cmake ninja-build libibverbs-dev

configure=(cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRDMABUF_WERROR=ON
  -DCMAKE_CXX_COMPILER=clang++ -DRDMABUF_FUZZ=ON -DBUILD_SHARED_LIBS=OFF
  -DRDMABUF_BUILD_TESTS=OFF -DRDMABUF_BUILD_TOOLS=OFF -DRDMABUF_BUILD_PYTHON=OFF)
[ -f "$build_dir/CMakeCache.txt" ] || configure+=(-G Ninja)
"${configure[@]}" >/dev/null
cmake --build "$build_dir"

if [ -n "${RDMABUF_FUZZ_TARGETS:-}" ]; then
  read -r -a targets <<<"$RDMABUF_FUZZ_TARGETS"
else
  mapfile -t targets < <(find "$build_dir/fuzz" -maxdepth 1 -type f -name 'fuzz_*' -perm -u+x \
    -printf '%f\n' | sort)
fi
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no targets built in $build_dir/fuzz" >&2; exit 1; }

# halt_on_error and no recovery: the first report ends the run, as a crash.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for target in "${targets[@]}"; do
  corpus="$build_dir/fuzz-corpus/$target"
  artifacts="$build_dir/fuzz-artifacts/$target"
  log="$build_dir/fuzz-logs/$target.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  # -timeout: one input taking this long is a hang; the targets themselves
  # give up on a socket after 10 s.
  if "$build_dir/fuzz/$target" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2560 \
    -dict=fuzz/dict -artifact_prefix="$artifacts/" -print_final_stats=1 \
    "$corpus" "fuzz/corpus/$target" >"$log" 2>&1; then
    stats=$(grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added):' \
      "$log" | sed 's/^stat:://' | tr '\n' ' ')
    echo "fuzz: $target OK ($seconds s: $stats)"
  else
    echo "fuzz: $target FAILED; the end of $log:" >&2
    tail -n 60 "$log" >&2
    failed+=("$target")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (reproducers in $build_dir/fuzz-artifacts/)" >&2
  exit 1
fi
echo "fuzz: OK (${#targets[@]} targets, $seconds s each)"
