"""Small reads from Python over a NIC: registrations reused, beside C++.

    PYTHONPATH=build/python /usr/bin/python3 -m rdmabuf.bench_registrations \\
        [--backend ibverbs] [--reads 1000] [--size 64K] [--cxx-iters 200]

Starts `rdmabuf serve` (one --size buffer, the `seq` pattern, --backend
only) and, against that one process:

- C++: `rdmabuf bench --json --sizes SIZE --window SIZE --connect HANDLE`,
  whose SIZE row is --cxx-iters reads of SIZE one at a time, into memory
  with a keepalive (registered once); the median time of one read;
- Python: --reads `read_into` of one numpy array of SIZE bytes, one at a
  time, each waited with get(): the median time of one read, and how many
  registrations of local memory the backend made for them (its detail
  "local registrations made"); every read checked against the pattern;
- Python, the same into a bytearray, which has no storage identity and is
  registered for every read: what every Python read cost before
  registrations were reused.

Over ibverbs this needs an RDMA device (scripts/softroce-vm runs it without
one: read its times as ratios only, the VM's CPU being emulated).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import rdmabuf

from ._manager import default_manager
from .bench import expected_pattern, find_tool


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def registrations_made(backend: str) -> int:
    for name, _level, _viable, _reason, details in default_manager().backends():
        if name == backend:
            for key, value in details:
                if key == "local registrations made":
                    return int(value)
    return -1  # the backend registers nothing (tcp, memory)


def cxx_read_us(tool: str, backend: str, size: int, iters: int, handle: str) -> float:
    cmd = [tool, "bench", "--json", "--quiet", "--backend", backend, "--sizes", str(size),
           "--window", str(size), "--iters", str(iters), "--peer", "none", "--connect", handle]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        row = json.loads(line)
        if row.get("op") == "read" and row.get("size") == size and row.get("kind") not in (
            "setup", "rate", "latency"
        ) and row.get("gbps"):
            return size / (row["gbps"] * 1e9) * 1e6
    raise SystemExit(f"bench_registrations: no {size} B read row in: {out}")


def python_reads(buf: rdmabuf.RDMABuffer, dst: Any, reads: int, backend: str) -> Dict[str, float]:
    pattern = expected_pattern(buf.size())[: buf.size()]
    before = registrations_made(backend)
    times: List[float] = []
    for _ in range(reads):
        t0 = time.perf_counter()
        buf.read_into(dst).get()
        times.append(time.perf_counter() - t0)
    if bytes(memoryview(dst)[: buf.size()]) != pattern:
        raise SystemExit("bench_registrations: read back bytes that differ from the pattern")
    after = registrations_made(backend)
    return {"p50_us": statistics.median(times) * 1e6, "registrations": after - before}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", help="the rdmabuf command (default: <build>/tools/rdmabuf)")
    parser.add_argument("--backend", default="ibverbs")
    parser.add_argument("--reads", type=int, default=1000, help="Python reads of each kind")
    parser.add_argument("--size", default="64K", help="bytes per read (K/M suffixes)")
    parser.add_argument("--cxx-iters", type=int, default=200, help="C++ reads (bench --iters)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = parser.parse_args(argv)
    size = parse_size(args.size)
    tool = find_tool(args.tool)
    rdmabuf.configure(backends=args.backend)
    import numpy

    env = dict(os.environ, RDMABUF_BACKENDS=args.backend)
    serve = subprocess.Popen([tool, "serve", "--size", str(size), "--pattern", "seq"],
                             stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert serve.stdout is not None
        handle = serve.stdout.readline().strip()
        if not handle:
            raise SystemExit("bench_registrations: the peer printed no handle")
        buf = rdmabuf.RDMABuffer.from_text(handle)
        if buf.backend != args.backend:
            raise SystemExit(f"bench_registrations: reads would go over {buf.backend}, "
                             f"not {args.backend}")
        cxx_us = cxx_read_us(tool, args.backend, size, args.cxx_iters, handle)
        array = python_reads(buf, numpy.zeros(size, dtype=numpy.uint8), args.reads, args.backend)
        plain = python_reads(buf, bytearray(size), args.reads, args.backend)
    finally:
        serve.terminate()
        serve.wait()
    row = {"backend": args.backend, "size": size, "reads": args.reads,
           "cxx_p50_us": cxx_us, "py_array_p50_us": array["p50_us"],
           "py_array_registrations": array["registrations"],
           "py_bytearray_p50_us": plain["p50_us"],
           "py_bytearray_registrations": plain["registrations"],
           "ratio_array_to_cxx": array["p50_us"] / cxx_us,
           "ratio_bytearray_to_cxx": plain["p50_us"] / cxx_us}
    if args.json:
        print(json.dumps(row))
        return 0
    print(f"{args.reads} reads of {size} B one at a time over {args.backend}, medians, same peer\n")
    print(f"{'reader':<44} {'per read':>10} {'vs C++':>8} {'registrations':>14}")
    print(f"{'C++, memory with a keepalive':<44} {cxx_us:>7.1f} us {1:>7.2f}x {'-':>14}")
    for what, r in [("Python, numpy array (storage identity)", array),
                    ("Python, bytearray (registered per read)", plain)]:
        print(f"{what:<44} {r['p50_us']:>7.1f} us {r['p50_us'] / cxx_us:>7.2f}x "
              f"{r['registrations']:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
