"""Python beside C++: read bandwidth and small-read latency, in one run.

    PYTHONPATH=build/python /usr/bin/python3 -m rdmabuf.bench [--rounds N] [--json]

Starts `rdmabuf serve` (tcp only, 64 MiB, the `seq` pattern) as the peer and
measures from Python, through the public API:

- read_into of 4 MiB with 16 reads in flight (the C++ bench's 64 MiB window),
  awaited with asyncio.gather, waited with get(), and as one RDMAAction;
  also one 4 MiB read at a time;
- the latency of one 8 B read_into: p50 and p99 of single round trips, with
  get() and with await.

Each round first runs `rdmabuf bench --json --sizes 4M --peer none --backend
tcp --connect HANDLE` for the C++ figures of the same measures (read 4 MiB,
16 in flight in one batch; read 8 B latency) against the same peer process,
then the Python ones, and prints both with the ratio. Every figure is a
median (bandwidth: over repetitions after two warm-up ones; across rounds:
the median of the rounds), every Python read checked against the peer's
pattern (the C++ bench writes back what it read, so the pattern stays).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import rdmabuf

MiB = 1 << 20
SIZE = 4 * MiB
WINDOW = 64 * MiB
IN_FLIGHT = WINDOW // SIZE


def find_tool(given: Optional[str]) -> str:
    candidates = [given, os.environ.get("RDMABUF_TOOL")]
    # <build>/python/rdmabuf/bench.py -> <build>/tools/rdmabuf
    candidates.append(str(Path(__file__).resolve().parents[2] / "tools" / "rdmabuf"))
    candidates.append(shutil.which("rdmabuf"))
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    sys.exit("bench: cannot find the rdmabuf command; pass --tool or set RDMABUF_TOOL")


def percentile(values: Sequence[float], p: float) -> float:
    s = sorted(values)
    rank = max(1, -(-len(s) * p // 100))  # ceil, as the C++ bench
    return s[min(len(s), int(rank)) - 1]


class Peer:
    """`rdmabuf serve` in a child process, tcp only."""

    def __init__(self, tool: str, size: int) -> None:
        env = dict(os.environ, RDMABUF_BACKENDS="tcp")
        self.proc = subprocess.Popen(
            [tool, "serve", "--size", str(size), "--pattern", "seq"],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            sys.exit("bench: the peer printed no handle")
        self.buffer = rdmabuf.RDMABuffer.from_text(line)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def expected_pattern(n: int) -> bytes:
    return bytes(i % 251 for i in range(251)) * (n // 251 + 1)


def cxx_figures(tool: str, iters: int, peer: Optional[Peer]) -> Dict[str, float]:
    cmd = [tool, "bench", "--json", "--sizes", "4M", "--peer", "none", "--backend", "tcp",
           "--iters", str(iters)]
    if peer is not None:  # the same peer process as the Python figures
        cmd += ["--connect", peer.buffer.to_text()]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    figures: Dict[str, float] = {}
    for line in out.splitlines():
        row = json.loads(line)
        if row.get("op") != "read" or row.get("kind") in ("setup", "rate"):
            continue
        if row["size"] == SIZE:
            figures["read_4m_gbps"] = row["gbps"]
            figures["read_4m_batch"] = row["batch"]
        elif row["size"] == 8 and row["batch"] == 1:
            figures["read_8b_p50_us"] = row["p50_us"]
            figures["read_8b_p99_us"] = row["p99_us"]
    return figures


def python_figures(peer: Peer, iters: int, samples: int) -> Dict[str, float]:
    try:
        import numpy

        local: Any = numpy.zeros(WINDOW, dtype=numpy.uint8)
        view = memoryview(local)
    except ImportError:  # pragma: no cover
        local = bytearray(WINDOW)
        view = memoryview(local)
    remote = peer.buffer
    slices = [remote.slice(i * SIZE, SIZE) for i in range(IN_FLIGHT)]
    dsts = [view[i * SIZE:(i + 1) * SIZE] for i in range(IN_FLIGHT)]
    pattern = expected_pattern(WINDOW)[:WINDOW]

    def check(n: int) -> None:
        if bytes(view[:n]) != pattern[:n]:
            raise SystemExit("bench: read back bytes that differ from the peer's pattern")

    def gbps_of(run: Callable[[], object], nbytes: int) -> float:
        rates: List[float] = []
        for rep in range(2 + iters):
            t0 = time.perf_counter()
            run()
            dt = time.perf_counter() - t0
            if rep >= 2:
                rates.append(nbytes / dt / 1e9)
        return statistics.median(rates)

    figures: Dict[str, float] = {}
    loop = asyncio.new_event_loop()
    try:
        async def gather() -> None:
            await asyncio.gather(*[s.read_into(d) for s, d in zip(slices, dsts)])

        figures["gather"] = gbps_of(lambda: loop.run_until_complete(gather()), WINDOW)
        check(WINDOW)
        view[:] = b"\0" * WINDOW

        def blocking() -> None:
            futs = [s.read_into(d) for s, d in zip(slices, dsts)]
            for f in futs:
                f.get()

        figures["get"] = gbps_of(blocking, WINDOW)
        check(WINDOW)

        action = rdmabuf.RDMAAction()
        for s, d in zip(slices, dsts):
            action.read_remote(d, s)
        figures["action"] = gbps_of(lambda: action.submit().get(), WINDOW)
        check(WINDOW)

        figures["one"] = gbps_of(lambda: slices[0].read_into(dsts[0]).get(), SIZE)

        small = remote.slice(0, 8)
        dst8: Any = bytearray(8)
        lat: List[float] = []
        for i in range(100 + samples):
            t0 = time.perf_counter_ns()
            small.read_into(dst8).get()
            t1 = time.perf_counter_ns()
            if i >= 100:
                lat.append((t1 - t0) / 1e3)
        check(8)
        figures["lat_get_p50"] = percentile(lat, 50)
        figures["lat_get_p99"] = percentile(lat, 99)

        async def await_latency() -> List[float]:
            out: List[float] = []
            for i in range(100 + samples):
                t0 = time.perf_counter_ns()
                await small.read_into(dst8)
                t1 = time.perf_counter_ns()
                if i >= 100:
                    out.append((t1 - t0) / 1e3)
            return out

        alat = loop.run_until_complete(await_latency())
        figures["lat_await_p50"] = percentile(alat, 50)
        figures["lat_await_p99"] = percentile(alat, 99)
    finally:
        loop.close()
    return figures


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", help="the rdmabuf command (default: <build>/tools/rdmabuf)")
    parser.add_argument("--rounds", type=int, default=1, help="C++ then Python, this many times")
    parser.add_argument("--iters", type=int, default=20, help="bandwidth repetitions")
    parser.add_argument("--samples", type=int, default=2000, help="latency samples")
    parser.add_argument("--json", action="store_true", help="one JSON object per round")
    parser.add_argument("--own-peer", action="store_true",
                        help="let `rdmabuf bench` start its own peer (default: it reads from "
                             "the same `rdmabuf serve` process as Python, with --connect)")
    args = parser.parse_args(argv)
    tool = find_tool(args.tool)
    rdmabuf.configure(backends="tcp")

    peer = Peer(tool, WINDOW)
    rounds: List[Dict[str, float]] = []
    try:
        for r in range(args.rounds):
            print(f"bench: round {r + 1}/{args.rounds}: C++ ...", file=sys.stderr)
            cxx = cxx_figures(tool, args.iters, None if args.own_peer else peer)
            print(f"bench: round {r + 1}/{args.rounds}: Python ...", file=sys.stderr)
            py = python_figures(peer, args.iters, args.samples)
            row = {f"cxx_{k}": v for k, v in cxx.items()}
            row.update({f"py_{k}": v for k, v in py.items()})
            row["ratio_gbps"] = py["gather"] / cxx["read_4m_gbps"]
            row["extra_latency_us"] = py["lat_get_p50"] - cxx["read_8b_p50_us"]
            rounds.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    finally:
        peer.close()
    if args.json:
        return 0

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    cxx_bw = med("cxx_read_4m_gbps")
    cxx_lat = med("cxx_read_8b_p50_us")
    streams = rdmabuf.config().tcp_streams
    print(f"rdmabuf from Python vs `rdmabuf bench` (C++), same run: tcp, {streams} streams, "
          f"loopback, medians of {args.rounds} round(s)\n")
    print(f"{'measure':<52} {'Python':>10} {'C++':>10} {'ratio':>8}")
    for key, what in [
        ("py_gather", f"read_into 4 MiB x {IN_FLIGHT} in flight, asyncio.gather"),
        ("py_get", f"read_into 4 MiB x {IN_FLIGHT} in flight, get()"),
        ("py_action", f"RDMAAction of {IN_FLIGHT} x read_into 4 MiB"),
    ]:
        v = med(key)
        print(f"{what:<52} {v:>6.3f} GB/s {cxx_bw:>5.3f} GB/s {v / cxx_bw:>7.2f}x")
    one = med("py_one")
    print(f"{'read_into 4 MiB, one at a time, get()':<52} {one:>6.3f} GB/s {'':>10}")
    for key, what in [("py_lat_get_p50", "read_into 8 B, p50, get()"),
                      ("py_lat_await_p50", "read_into 8 B, p50, await")]:
        v = med(key)
        print(f"{what:<52} {v:>7.1f} us {cxx_lat:>7.1f} us {v - cxx_lat:>+6.1f} us")
    print(f"{'read_into 8 B, p99, get()':<52} {med('py_lat_get_p99'):>7.1f} us "
          f"{med('cxx_read_8b_p99_us'):>7.1f} us")
    print("\nC++ rows: `rdmabuf bench` read 4 MiB (batch of 16 in one submit) and read 8 B latency.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
