#!/usr/bin/env bash
# The ctest tests bench_json_BACKEND: `rdmabuf bench --json` against its own
# peer process, with the peer tools installed here measured beside it. It
# must exit 0 and print only JSON objects, one a line, each with the fields
# docs/cli.md lists; every rdmabuf row names this backend; and where iperf3
# is installed (tcp), its row must be there, as must the fetch-add rate row
# over tcp, and the scattered rows everywhere. Exit 77 (a skip) when the
# backend is not viable here.
#
#   check_bench_json.sh RDMABUF_TOOL BACKEND
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: $0 RDMABUF_TOOL BACKEND" >&2; exit 2; }
tool=$1 backend=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

rc=0
"$tool" bench --json --quiet --backend "$backend" --sizes 64K --iters 2 --batch 64 \
  >"$tmp/out" 2>"$tmp/err" || rc=$?
if [ "$rc" -ne 0 ]; then
  cat "$tmp/err" >&2
  if grep -q "is not viable here" "$tmp/err"; then exit 77; fi
  echo "FAIL: rdmabuf bench --json --backend $backend exited $rc" >&2
  exit 1
fi
cat "$tmp/out"

expect_iperf=0
if [ "$backend" = tcp ] && command -v iperf3 >/dev/null; then expect_iperf=1; fi
/usr/bin/python3 - "$tmp/out" "$backend" "$expect_iperf" <<'PY'
import json, sys
path, backend, expect_iperf = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
fields = {"system", "backend", "op", "kind", "size", "batch", "streams", "gbps",
          "p50_us", "p99_us", "ops_per_s", "reps"}
rows = []
for n, line in enumerate(open(path), 1):
    try:
        row = json.loads(line)
    except ValueError as e:
        sys.exit(f"FAIL: line {n} is not JSON ({e}): {line!r}")
    missing = fields - row.keys()
    if missing:
        sys.exit(f"FAIL: line {n} lacks {sorted(missing)}: {line!r}")
    rows.append(row)
ours = [r for r in rows if r["system"] == "rdmabuf"]
if not ours:
    sys.exit("FAIL: no rdmabuf rows")
if any(r["backend"] != backend for r in ours):
    sys.exit(f"FAIL: an rdmabuf row names another backend than {backend}")
if not any(r["kind"] == "bandwidth" and r["gbps"] > 0 for r in ours):
    sys.exit("FAIL: no bandwidth row with a figure")
scattered = [r for r in ours if r["kind"] == "scattered"]
if len(scattered) != 6 or any(r["gbps"] <= 0 or r.get("peer_gbps", 0) <= 0 for r in scattered):
    sys.exit("FAIL: not 6 scattered rows (read and write, each beside 3 shapes) with figures")
if backend == "tcp" and not any(r["op"] == "fetch-add" and r["kind"] == "rate"
                                and r["ops_per_s"] > 0 for r in ours):
    sys.exit("FAIL: no fetch-add rate row over tcp")
if expect_iperf and not any(r["system"] == "iperf3" and r["gbps"] > 0 for r in rows):
    sys.exit("FAIL: iperf3 is installed but its row is missing")
print(f"bench --json --backend {backend}: {len(rows)} rows, all JSON")
PY
