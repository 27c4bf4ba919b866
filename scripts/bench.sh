#!/usr/bin/env bash
# Sets up and builds (scripts/setup.sh), then runs `rdmabuf bench` with the
# arguments given: with none, it starts a peer process on this machine and
# measures rdmabuf next to iperf3 on the same loopback. See README.md.
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
exec "$tool" bench "$@"
