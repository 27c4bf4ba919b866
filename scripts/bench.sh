#!/usr/bin/env bash
# Sets up and builds (scripts/setup.sh), then benchmarks.
#
#   scripts/bench.sh            rdmabuf bench --compare --out bench-results:
#                               rdmabuf over every viable backend beside iperf3,
#                               qperf, UCX (TCP and shared memory), memcpy and
#                               perftest (in the Soft-RoCE VM when this machine
#                               has no RDMA device); a table on stdout, and
#                               table.txt, results.json and bandwidth.svg in
#                               bench-results/. See docs/performance.md.
#   scripts/bench.sh ARGS...    rdmabuf bench ARGS... (e.g. --backend tcp --json)
#
# RDMABUF_BUILD_DIR as in setup.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Build output goes to stderr so that stdout carries only the results
# (`scripts/bench.sh --json > results.jsonl`).
scripts/setup.sh >&2
tool="${RDMABUF_BUILD_DIR:-build}/tools/rdmabuf"
if [ ! -x "$tool" ]; then
  echo "bench: $tool was not built (is RDMABUF_BUILD_TOOLS off?)" >&2
  exit 1
fi
[ $# -gt 0 ] || set -- --compare --out bench-results
exec "$tool" bench "$@"
