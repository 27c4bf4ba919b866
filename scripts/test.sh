#!/usr/bin/env bash
# The test command: sets up and builds (scripts/setup.sh), then runs every
# test. Extra arguments go to ctest, e.g. `scripts/test.sh -L packaging` or
# `scripts/test.sh -R conformance`. RDMABUF_BUILD_DIR as in setup.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
# --timeout is the default for tests that do not set their own; a hung test
# fails instead of stalling the run.
exec ctest --test-dir "${RDMABUF_BUILD_DIR:-build}" --output-on-failure -j2 \
  --no-tests=error --timeout 600 "$@"
