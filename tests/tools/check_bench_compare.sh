#!/usr/bin/env bash
# The ctest test bench_compare_short: `rdmabuf bench --compare` end to end,
# small (one round, two sizes, no VM, nothing installed), with real peer
# processes: it must exit 0, print the table, and write a results.json that
# parses, holds rdmabuf's figures for every viable backend and a comparison
# for every peer that is installed here, and an SVG plot with their lines.
#
#   check_bench_compare.sh RDMABUF_TOOL OUT_DIR
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: $0 RDMABUF_TOOL OUT_DIR" >&2; exit 2; }
tool=$1 out=$2
rm -rf "$out"

"$tool" bench --compare --rounds 1 --sizes 4K,64K --iters 2 --seconds 1 --no-vm --no-install \
  --out "$out" >"$out.table" 2>"$out.log" || {
  cat "$out.log" >&2
  echo "FAIL: rdmabuf bench --compare exited non-zero" >&2
  exit 1
}
cat "$out.table"
for f in table.txt results.json bandwidth.svg; do
  [ -s "$out/$f" ] || { echo "FAIL: $out/$f is missing or empty" >&2; exit 1; }
done
cmp -s "$out.table" "$out/table.txt" || { echo "FAIL: table.txt is not the printed table" >&2; exit 1; }

# Peers that must be compared when installed: the plain tools. UCX may be
# installed yet unable to run in a given sandbox (shared memory, ports); then
# it must be listed as not measured, with the reason.
expected_peers=(memcpy)
# iperf3 runs with as many streams as rdmabuf's tcp backend uses.
streams=$("$tool" info | awk '$1 == "tcp_streams" { print $2 }')
[ -n "$streams" ] || { echo "FAIL: rdmabuf info shows no tcp_streams" >&2; exit 1; }
command -v iperf3 >/dev/null && expected_peers+=("iperf3 -P $streams")
command -v qperf >/dev/null && expected_peers+=(qperf)
reported_peers=()
command -v ucx_perftest >/dev/null && reported_peers+=("UCX tcp" "UCX shm")

# The JSON, checked with Python's own parser (any python3 will do).
python3 - "$out/results.json" "$out/bandwidth.svg" "${#expected_peers[@]}" \
  "${expected_peers[@]}" "${reported_peers[@]}" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))
svg = open(sys.argv[2]).read()
count = int(sys.argv[3])
peers, reported = sys.argv[4:4 + count], sys.argv[4 + count:]
systems = {f["system"] for f in results["figures"]}
for backend in ("tcp", "memory"):
    assert "rdmabuf " + backend in systems, f"no figures of rdmabuf {backend}: {systems}"
for f in results["figures"]:
    assert f["runs"] == 1, f
    if f["system"].startswith("rdmabuf") and f["kind"] == "bandwidth":
        assert f["gbps"] > 0, f
compared = {c["peer"] for c in results["comparisons"]}
for p in peers:
    assert p in compared, f"no comparison with {p}: {compared}; skipped: {results['skipped']}"
skipped = {s["system"]: s["why"] for s in results["skipped"]}
for p in reported:
    if p in compared:
        peers.append(p)
    else:
        assert skipped.get(p), f"{p} is installed, yet neither compared nor reported skipped"
        print(f"warning: {p} not measured: {skipped[p]}")
for c in results["comparisons"]:
    assert c["speedup"] > 0, c
for label in ["rdmabuf tcp", "rdmabuf memory"] + peers:
    assert label in svg, f"the plot has no line for {label}"
assert svg.count("<polyline") >= 2 * 2, "fewer lines than two backends in two panels"
print("bench --compare: ok,", len(results["figures"]), "figures,",
      len(results["comparisons"]), "comparisons")
PY
