"""Collective patterns across ranks and hosts, rdmabuf beside
torch.distributed's send/recv (gloo), in the same processes and run.

    rdmabuf bench --pattern ring                      # the CLI runs this module
    python3 -m rdmabuf.bench_patterns --pattern all   # 4 ranks on 2 hosts of this machine
    torchrun --nnodes=2 --nproc_per_node=8 ... -m rdmabuf.bench_patterns --pattern fan-in
    srun python3 -m rdmabuf.bench_patterns ...        # examples/slurm/bench_patterns.sbatch

Patterns, each transfer SIZE bytes (rank r of n):
  p2p         rank r sends to rank r + n/2, for r < n/2 (pairs across hosts
              when ranks fill hosts in order)
  fan-in      every rank sends to rank 0
  fan-out     rank 0 sends to every rank
  all-to-all  every rank sends to every other rank
  ring        rank r sends to rank r + 1 (mod n)

rdmabuf moves each transfer as a one-sided read by the receiver (a Window
over the senders' memory, rdmabuf.distributed); gloo as an isend / irecv
pair. Each timed iteration is the same for both: a barrier, every
transfer started (WINDOW // SIZE times over, into distinct memory, so
that a small size is not a measure of two barriers) and waited for, a
barrier; the figure is the bytes of all transfers over the median
iteration time (GB/s, 1e9 bytes). Iterations of the two alternate. Cold is the first iteration of a pattern and size,
timed the same way: for rdmabuf it includes registering the memory and
sharing the handles (gloo's connections were made by
init_process_group). Every received byte is checked after every iteration
(untimed): a fast wrong answer fails the run.

Launch: under torchrun (RANK, WORLD_SIZE, MASTER_ADDR), srun (SLURM_PROCID,
SLURM_NTASKS, MASTER_ADDR from the batch script) or mpirun (Open MPI's
OMPI_COMM_WORLD_*; MASTER_ADDR from the environment, or rank 0's host
sent by mpi4py), each process is one rank. Started alone, it starts --procs ranks itself: spread over --hosts
hosts of this machine (rdmabuf.netns_hosts; root needed), or on this host.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rdmabuf.netns_hosts import Hosts, can_make_hosts, die_with_parent

PATTERNS = ("p2p", "fan-in", "fan-out", "all-to-all", "ring")
MiB = 1 << 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = units.get(text[-1:], 1)
    value = int(text[:-1] if text[-1:] in units else text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return value * scale


def human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def transfers(pattern: str, n: int) -> List[Tuple[int, int]]:
    """(sender, receiver) of every transfer of one iteration."""
    if pattern == "p2p":
        return [(r, r + n // 2) for r in range(n // 2)]
    if pattern == "fan-in":
        return [(r, 0) for r in range(1, n)]
    if pattern == "fan-out":
        return [(0, r) for r in range(1, n)]
    if pattern == "all-to-all":
        return [(s, d) for s in range(n) for d in range(n) if s != d]
    if pattern == "ring":
        return [(r, (r + 1) % n) for r in range(n)]
    raise ValueError(pattern)


# --- One rank ----------------------------------------------------------------------


def launched_rank() -> Optional[Tuple[int, int]]:
    """(rank, world size) when a launcher started this process."""
    for rank, size in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                       ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):  # fmt: skip
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return None


class Rank:
    """This process's part: its group, buffers and both ways of moving them."""

    def __init__(self, rank: int, size: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        torch.set_num_threads(1)
        if "MASTER_ADDR" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
            self._rendezvous_from_mpi()
        os.environ.setdefault("MASTER_PORT", "29500")
        if "MASTER_ADDR" not in os.environ:
            sys.exit("bench_patterns: MASTER_ADDR is not set (rank 0's host, for the rendezvous)")
        dist.init_process_group("gloo", rank=rank, world_size=size)
        self.rank, self.size = rank, size
        self.hosts: List[str] = [""] * size
        dist.all_gather_object(self.hosts, socket.gethostname())

    @staticmethod
    def _rendezvous_from_mpi() -> None:
        """Under mpirun without MASTER_ADDR: rank 0's host name and a free
        port of it, sent to every rank by MPI (when mpi4py is there)."""
        try:
            from mpi4py import MPI
        except ImportError:
            return
        mine = (socket.gethostname(), free_port()) if MPI.COMM_WORLD.Get_rank() == 0 else None
        host, port = MPI.COMM_WORLD.bcast(mine, root=0)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = host, str(port)

    def payload(self, sender: int, size: int) -> Any:
        """The bytes `sender` sends: distinct per sender and position."""
        torch = self.torch
        return ((torch.arange(size, dtype=torch.int64) * 7 + sender * 31) % 251).to(torch.uint8)

    def run(self, pattern: str, size: int, iters: int, reps: int) -> Optional[Dict[str, Any]]:
        """One pattern at one size, each transfer `reps` times an iteration;
        the figures on rank 0."""
        import rdmabuf
        from rdmabuf.distributed import Window

        torch, dist = self.torch, self.dist
        plan = transfers(pattern, self.size)
        senders = sorted({s for s, d in plan if d == self.rank})
        receivers = sorted({d for s, d in plan if s == self.rank})
        mine = self.payload(self.rank, size)
        expected = {s: self.payload(s, size) for s in senders}
        landed = {(s, k): torch.zeros(size, dtype=torch.uint8) for s in senders for k in range(reps)}

        window: List[Any] = []  # made by the first rdmabuf iteration (cold)
        action: List[Any] = []

        def rdmabuf_iteration() -> None:
            if not window:
                window.append(Window(mine))
                batch = rdmabuf.RDMAAction()
                for (s, _), into in landed.items():
                    batch.read_remote(into, window[0][s])
                action.append(batch)
            if len(action[0]):
                action[0].submit().get()

        def gloo_iteration() -> None:
            works = [dist.isend(mine, d) for d in receivers for _ in range(reps)]
            works += [dist.irecv(into, s) for (s, _), into in landed.items()]
            for w in works:
                w.wait()

        def timed(step: Any) -> float:
            for buf in landed.values():
                buf.zero_()
            dist.barrier()
            t0 = time.perf_counter()
            step()
            dist.barrier()
            took = time.perf_counter() - t0
            for (s, _), got in landed.items():  # every byte, every time
                if not torch.equal(got, expected[s]):
                    bad = int((got != expected[s]).nonzero()[0])
                    raise RuntimeError(
                        f"rank {self.rank}: {pattern} {human(size)} from rank {s}: byte {bad} is "
                        f"{int(got[bad])}, not {int(expected[s][bad])}"
                    )
            # Rank 0 reports the slowest rank's time.
            slowest = [0.0] * self.size
            dist.all_gather_object(slowest, took)
            return max(slowest)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rdmabuf.RDMATcpFallbackWarning)
            cold = {"rdmabuf": timed(rdmabuf_iteration), "gloo": timed(gloo_iteration)}
            warm: Dict[str, List[float]] = {"rdmabuf": [], "gloo": []}
            for _ in range(iters):
                warm["rdmabuf"].append(timed(rdmabuf_iteration))
                warm["gloo"].append(timed(gloo_iteration))
            routes = [(s, window[0][s].backend) for s in senders]
        all_routes: List[Any] = [None] * self.size
        dist.all_gather_object(all_routes, routes)
        window[0].close()
        if self.rank != 0:
            return None
        moved = len(plan) * size * reps
        result: Dict[str, Any] = {"pattern": pattern, "size": size, "ranks": self.size,
                                  "hosts": len(set(self.hosts)), "transfers": len(plan),
                                  "repeats": reps, "iterations": iters}  # fmt: skip
        for system in ("rdmabuf", "gloo"):
            median = statistics.median(warm[system])
            result[system] = {"cold_ms": cold[system] * 1e3, "warm_ms": median * 1e3,
                              "warm_gbps": moved / median / 1e9}  # fmt: skip
        result["ratio"] = result["rdmabuf"]["warm_gbps"] / result["gloo"]["warm_gbps"]
        transports: Dict[str, int] = {}
        for per_rank in all_routes:
            for _, backend in per_rank:
                transports[backend] = transports.get(backend, 0) + 1
        result["transports"] = transports
        return result

    def close(self) -> None:
        self.dist.destroy_process_group()


def table(results: List[Dict[str, Any]], hosts: List[str]) -> str:
    by_host: Dict[str, List[int]] = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    placed = "; ".join(f"{h}: ranks {','.join(map(str, rs))}" for h, rs in by_host.items())
    lines = [
        f"rdmabuf bench --pattern: {len(hosts)} ranks on {len(by_host)} host(s) ({placed})",
        "each transfer's bytes checked; warm: median iteration; GB/s: all transfers' bytes "
        "over it",
        "",
        f"{'pattern':<11} {'size':>8} {'xfers':>7}  {'rdmabuf cold':>12} {'gloo cold':>10}  "
        f"{'rdmabuf':>10} {'gloo':>10} {'x gloo':>6}  transports",
    ]
    for r in results:
        rd, gl = r["rdmabuf"], r["gloo"]
        routes = ", ".join(f"{k} {v}" for k, v in sorted(r["transports"].items()))
        lines.append(
            f"{r['pattern']:<11} {human(r['size']):>8} {str(r['transfers']) + 'x' + str(r['repeats']):>7}  "
            f"{rd['cold_ms']:>9.1f} ms {gl['cold_ms']:>7.1f} ms  "
            f"{rd['warm_gbps']:>5.2f} GB/s {gl['warm_gbps']:>5.2f} GB/s {r['ratio']:>6.2f}  {routes}"
        )
    return "\n".join(lines)


def worker(args: argparse.Namespace, rank: int, size: int) -> int:
    me = Rank(rank, size)
    results = []
    for pattern in args.patterns:
        for nbytes in args.sizes:
            reps = max(1, args.window // nbytes)
            iters = args.iters or max(15, min(50, (512 * MiB) // (nbytes * reps)))
            result = me.run(pattern, nbytes, iters, reps)
            if result is not None:
                results.append(result)
                print(f"bench_patterns: {pattern} {human(nbytes)}: rdmabuf "
                      f"{result['rdmabuf']['warm_gbps']:.2f} GB/s, gloo "
                      f"{result['gloo']['warm_gbps']:.2f} GB/s", file=sys.stderr, flush=True)  # fmt: skip
    if rank == 0:
        print(table(results, me.hosts), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"hosts": me.hosts, "results": results}, f, indent=1)
    me.close()
    return 0


# --- Starting the ranks here ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def launch_here(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Starts --procs ranks of this module, in blocks on --hosts hosts of
    this machine (or on this host), and waits for them."""
    command = [sys.executable, "-m", "rdmabuf.bench_patterns", *argv]
    base = {**os.environ, "WORLD_SIZE": str(args.procs), "OMP_NUM_THREADS": "1"}
    base.setdefault("RDMABUF_LOG_LEVEL", "error")  # the routes are in the table
    per_host = -(-args.procs // args.hosts)
    procs: List[subprocess.Popen] = []
    made = None
    try:
        if args.hosts > 1:
            made = Hosts(args.hosts)
            made.up()
            base.update(MASTER_ADDR=made[0].address, MASTER_PORT="29500")
        else:
            base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        for rank in range(args.procs):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank % per_host)}
            out = None if rank == 0 else subprocess.DEVNULL
            if made is not None:
                procs.append(made[rank // per_host].popen(command, env=env, stdout=out))
            else:
                procs.append(subprocess.Popen(command, env=env, stdout=out,
                                              preexec_fn=die_with_parent))  # fmt: skip
        # The first rank to fail ends the run: the others would wait for it
        # in gloo's collectives until its 30-minute timeout.
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                print(f"bench_patterns: rank {failed[0]} exited with "
                      f"{procs[failed[0]].returncode}", file=sys.stderr)  # fmt: skip
                return 1
            time.sleep(0.1)
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        for r in failed:
            print(f"bench_patterns: rank {r} exited with {procs[r].returncode}", file=sys.stderr)
        return 1 if failed else 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if made is not None:
            made.down()


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="rdmabuf bench --pattern", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
    )  # fmt: skip
    parser.add_argument("--pattern", default="all",
                        help=f"{', '.join(PATTERNS)}, a comma-separated list, or all (default)")  # fmt: skip
    parser.add_argument("--sizes", default="1M,64M",
                        help="bytes per transfer, comma-separated, K/M/G (default 1M,64M)")  # fmt: skip
    parser.add_argument("--iters", type=int, default=0,
                        help="warm iterations of each system (default: 512 MiB of transfers, 15..50)")  # fmt: skip
    parser.add_argument("--window", default="16M",
                        help="each transfer repeats WINDOW // SIZE times an iteration (16M)")  # fmt: skip
    parser.add_argument("--procs", type=int, default=4, help="ranks to start, when not launched (4)")
    parser.add_argument("--hosts", type=int, default=0,
                        help="hosts of this machine to spread them over (default 2 where "
                        "namespaces can be made, else 1)")  # fmt: skip
    parser.add_argument("--json", help="also write the figures here, as JSON (rank 0)")
    args = parser.parse_args(argv)
    args.patterns = list(PATTERNS) if args.pattern == "all" else args.pattern.split(",")
    for p in args.patterns:
        if p not in PATTERNS:
            parser.error(f"--pattern: {p!r} is not one of {', '.join(PATTERNS)}")
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",")]
        args.window = parse_size(args.window)
    except (ValueError, argparse.ArgumentTypeError) as e:
        parser.error(f"--sizes: {e}")
    launched = launched_rank()
    if launched is not None:
        return worker(args, *launched)
    if args.procs < 2:
        parser.error("--procs: at least 2 ranks")
    if args.hosts == 0:
        args.hosts = 2 if can_make_hosts() else 1
        if args.hosts == 1:
            print("bench_patterns: every rank on this host (namespaces need root)", file=sys.stderr)
    if not 1 <= args.hosts <= args.procs:
        parser.error("--hosts: 1 to --procs")
    return launch_here(args, argv)


if __name__ == "__main__":
    sys.exit(main())
