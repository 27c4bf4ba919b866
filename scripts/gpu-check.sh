#!/usr/bin/env bash
# gpu-check.sh: on a machine with an NVIDIA GPU, builds rdmabuf, runs its GPU
# tests on the real GPU and a short benchmark, and prints one summary line,
# last:
#
#   gpu-check: PASS | NVIDIA H200, CUDA 13.0 | C++ 430/430, Python 11/11 |
#     memory read 256 MiB 1234.5 GB/s = 0.98x torch | tcp read 64 MiB ... | 312 s
#
#   scripts/gpu-check.sh                 on the real GPU (libcuda.so.1)
#   scripts/gpu-check.sh --test-driver   the same steps on the test driver
#                                        (tests/fake_cuda), to check this
#                                        script on a machine without a GPU
#   scripts/gpu-check.sh --prepare       copies GoogleTest's sources from
#                                        /usr/src/googletest to
#                                        third_party/googletest, for a GPU
#                                        machine that has no GoogleTest
#
# Installs and downloads nothing. Needs cmake, ninja (or make), a C++20
# compiler and the CUDA driver; for the C++ tests GoogleTest, installed or
# as sources (RDMABUF_GTEST_SOURCE, else third_party/googletest, else
# /usr/src/googletest); for the Python tests python3 with pybind11, pytest
# and numpy, and torch with CUDA for the tensor tests. What is missing is
# named in the summary and fails the check. Builds into build-gpu/; every
# step's output is kept in build-gpu/gpu-check/. About 5 minutes on 16
# cores; each step has a time limit, so the whole stays under 8.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
mode=real
case "${1:-}" in
  "") ;;
  --test-driver) mode=test-driver ;;
  --prepare)
    [ -d /usr/src/googletest ] || { echo "gpu-check: no /usr/src/googletest here" >&2; exit 1; }
    rm -rf third_party/googletest && mkdir -p third_party && cp -r /usr/src/googletest third_party/
    echo "gpu-check: GoogleTest's sources are in third_party/googletest (ignored by git)"
    exit 0
    ;;
  *) echo "usage: $0 [--test-driver | --prepare]" >&2; exit 2 ;;
esac

start=$SECONDS
build=build-gpu
logs=$build/gpu-check
mkdir -p "$logs"
problems=()
note() { problems+=("$1"); echo "gpu-check: $1" >&2; }
# step NAME LIMIT_S COMMAND...: runs it with its output in $logs/NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  echo "gpu-check: $name ($((SECONDS - start)) s)" >&2
  if ! timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1; then
    tail -n 30 "$logs/$name.log" >&2
    return 1
  fi
}
summary() {
  local verdict=PASS
  [ ${#problems[@]} -eq 0 ] || verdict=FAIL
  local line="gpu-check: $verdict | $gpu | C++ ${cpp:-not run}, Python ${py:-not run} | ${bench:-bench not run}"
  [ ${#problems[@]} -eq 0 ] || line+=" | problems: $(IFS=';'; echo "${problems[*]}")"
  echo "$line | $((SECONDS - start)) s"
  [ "$verdict" = PASS ]
  exit
}

jobs=$(nproc)
python=$(command -v python3 || true)
gtest=${RDMABUF_GTEST_SOURCE:-}
for candidate in third_party/googletest /usr/src/googletest; do
  [ -n "$gtest" ] || [ ! -f "$candidate/CMakeLists.txt" ] || gtest=$repo/$candidate
done
[ -z "$gtest" ] || [ "${gtest:0:1}" = / ] || gtest=$repo/$gtest
[ "$gtest" != "$repo//usr/src/googletest" ] || gtest=/usr/src/googletest

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake_args=(-S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DRDMABUF_LTO=OFF
            -DRDMABUF_WERROR=OFF)
[ -z "$gtest" ] || cmake_args+=(-DRDMABUF_GTEST_SOURCE="$gtest")
if [ -n "$python" ]; then
  cmake_args+=(-DPython3_EXECUTABLE="$python")
  pybind11_dir=$("$python" -m pybind11 --cmakedir 2>/dev/null || true)
  [ -z "$pybind11_dir" ] || cmake_args+=(-Dpybind11_DIR="$pybind11_dir")
fi
gpu="no GPU information"
step configure 120 cmake "${cmake_args[@]}" || { note "cmake failed ($logs/configure.log)"; summary; }
grep -q "checking common/cuda_api.h against" "$logs/configure.log" ||
  note "no cuda.h: the declarations were not checked against it"
targets=(rdmabuf_cli conformance_tests integration_tests rdmabuf_test_peer rdmabuf_test_reader
         rdmabuf_fake_cuda)
python_built=0
if grep -q "rdmabuf: Python package for" "$logs/configure.log"; then
  targets+=(_rdmabuf rdmabuf_python)
  python_built=1
else
  note "no Python package (python3 with pybind11 needed)"
fi
step build 330 cmake --build "$build" -j "$jobs" --target "${targets[@]}" ||
  { note "the build failed ($logs/build.log)"; summary; }

if [ "$mode" = real ]; then
  export RDMABUF_TEST_REAL_GPU=1
  unset RDMABUF_CUDA_DRIVER
else
  export RDMABUF_CUDA_DRIVER=$repo/$build/tests/librdmabuf_fake_cuda.so
  export RDMABUF_TEST_CUDA_DRIVER=$RDMABUF_CUDA_DRIVER
fi
step info 30 "$build/tools/rdmabuf" info
gpu=$(sed -n 's/^  cuda:0  \([^,]*\),.*/\1/p' "$logs/info.log")
driver=$(sed -n 's/^GPU memory: CUDA driver \([0-9.]*\).*/CUDA \1/p' "$logs/info.log")
if [ -z "$gpu" ]; then
  note "no GPU: $(grep '^GPU memory' "$logs/info.log")"
  summary
fi
gpu="$gpu, $driver"

# The C++ GPU tests: the conformance suite with GPU memory over the
# same-host transports (there is no RDMA NIC), in 4 shards at once, and the
# integration tests that use GPU memory.
passed=0 total=0
shard_pids=()
for i in 0 1 2 3; do
  GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 240 "$build/tests/conformance_tests" \
    --gtest_filter='Gpu/*:-*ibverbs*' >"$logs/conformance-$i.log" 2>&1 &
  shard_pids+=($!)
done
echo "gpu-check: C++ tests ($((SECONDS - start)) s)" >&2
timeout 240 "$build/tests/integration_tests" --gtest_filter='*Gpu*:-GpuWithoutDriverTest.*' >"$logs/integration.log" 2>&1
integration_status=$?
for pid in "${shard_pids[@]}"; do wait "$pid" || true; done
for log in "$logs"/conformance-*.log "$logs/integration.log"; do
  ran=$(sed -n 's/^\[==========\] \([0-9]*\) tests\{0,1\} from .* ran\..*/\1/p' "$log")
  ok=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$log")
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\},.*/\1/p' "$log")
  total=$((total + ${ran:-0} - ${skipped:-0}))
  passed=$((passed + ${ok:-0}))
  grep -h '^\[  FAILED  \] [A-Z]' "$log" >&2
done
cpp="$passed/$total"
[ "$total" -gt 0 ] && [ "$passed" = "$total" ] && [ "$integration_status" = 0 ] ||
  note "C++ tests failed ($logs/conformance-*.log, integration.log)"

if [ "$python_built" = 1 ]; then
  if PYTHONPATH=$build/python RDMABUF_TIMEOUT_MS=20000 timeout 180 "$python" -m pytest -q \
       -p no:cacheprovider -rs tests/python/test_gpu.py >"$logs/python.log" 2>&1; then :; else
    tail -n 30 "$logs/python.log" >&2
    note "Python tests failed ($logs/python.log)"
  fi
  ok=$(grep -o '[0-9]* passed' "$logs/python.log" | tail -1 | cut -d' ' -f1)
  bad=$(grep -o '[0-9]* failed' "$logs/python.log" | tail -1 | cut -d' ' -f1)
  skip=$(grep -o '[0-9]* skipped' "$logs/python.log" | tail -1 | cut -d' ' -f1)
  py="${ok:-0}/$((${ok:-0} + ${bad:-0}))"
  [ "${skip:-0}" = 0 ] || py+=" (${skip} skipped: $(grep -o 'SKIPPED \[[0-9]*\] [^ ]* \(.*\)' "$logs/python.log" | head -1 | sed 's/.*: //'))"
fi

# The benchmark: GPU to GPU on one host beside torch's copy, and over tcp
# beside host memory.
if step bench 150 "$build/tools/rdmabuf" bench --gpu --iters 10 --json; then
  bench=$("$python" - "$logs/bench.log" <<'EOF' 2>/dev/null || echo "bench output unreadable"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
out = []
for r in rows:
    if r["op"] != "read":
        continue
    peer = "torch" if r["path"] == "memory" else "host"
    ratio = f"{r['ratio']:.2f}x {peer}" if r["ratio"] is not None else f"no {peer} figure"
    out.append(f"{r['path']} read {r['size'] >> 20} MiB {r['gbps']:.1f} GB/s = {ratio}")
print(" | ".join(out))
EOF
)
else
  note "the benchmark failed ($logs/bench.log)"
fi
summary
