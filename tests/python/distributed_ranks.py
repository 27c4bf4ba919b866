"""What each rank of test_distributed.py does, in processes of its own: a
torch.distributed gloo group over TCP on this host, then one scenario.
Each returns what the test checks, or the exception it raised."""

from __future__ import annotations

import os
import socket
import warnings
from typing import Any, Callable


def run_rank(rank: int, size: int, port: int, scenario: str, results: Any) -> None:
    try:
        import torch.distributed as dist

        import rdmabuf

        warnings.simplefilter("ignore", rdmabuf.RDMATcpFallbackWarning)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=size)  # fmt: skip
        outcome: Any = SCENARIOS[scenario](rank, size)
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 -- reported to the test
        outcome = e
    results.put((rank, outcome))


def patterns(rank: int, size: int) -> Any:
    import numpy as np
    import torch

    import rdmabuf.distributed as rd

    weights = torch.arange(1 << 18, dtype=torch.float32) if rank == 1 else torch.zeros(1 << 18)
    rd.broadcast(weights, src=1)
    assert torch.equal(weights, torch.arange(1 << 18, dtype=torch.float32))
    sent = np.arange(size * 100, dtype=np.int32) + 1000 * rank
    got = np.zeros_like(sent)
    rd.all_to_all(got, sent)
    want = np.concatenate([np.arange(rank * 100, rank * 100 + 100) + 1000 * i for i in range(size)])
    assert (got == want).all(), got
    out = bytearray(size * 10) if rank == 0 else None
    rd.gather(bytearray([rank]) * 10, out, dst=0)
    if rank == 0:
        assert out == b"".join(bytes([r]) * 10 for r in range(size)), out
    with rd.Window(torch.full((4096,), rank, dtype=torch.uint8)) as win:
        peer = (rank + 1) % size
        dst = torch.empty(100, dtype=torch.uint8)
        win.read(peer, dst, offset=10).get()
        assert bool((dst == peer).all())
        win.barrier()
        win.write(peer, torch.full((8,), 200 + rank, dtype=torch.uint8), offset=4088).get()
        win.barrier()
        mine = win._bytes  # written by the rank to the left
        assert bool((mine[4088:] == 200 + (rank - 1) % size).all()), mine[4088:]
        return win[peer].backend


def one_rank_used_rdmabuf_before(rank: int, size: int) -> Any:
    import rdmabuf
    import rdmabuf.distributed as rd

    if rank == 0:  # its manager exists before the window; the others' not
        rdmabuf.RDMABuffer(bytearray(8)).drop().get()
    data = bytearray(b"abc" * 100) if rank == 0 else bytearray(300)
    rd.broadcast(data, src=0)
    return bytes(data[:6])


def bad_argument_on_one_rank(rank: int, size: int) -> Any:
    import rdmabuf.distributed as rd

    with rd.Window(bytearray(64)) as win:
        try:
            win.gather(None, dst=0)  # rank 0 forgot its output; the others are fine
        except Exception as e:  # noqa: BLE001 -- the window goes on afterwards
            first = e
        win.broadcast(src=0)  # the ranks still agree on their collectives
        return first


def output_overlaps_the_window(rank: int, size: int) -> Any:
    import rdmabuf.distributed as rd

    memory = bytearray(2 * 3 * size)
    view = memoryview(memory)
    with rd.Window(view[: 3 * size]) as win:
        try:  # rank 1's output runs into its own memory; the others' lie apart
            win.all_to_all(view[1 : 1 + 3 * size] if rank == 1 else view[3 * size :])
        except Exception as e:  # noqa: BLE001 -- the window goes on afterwards
            return e
    return None


def sizes_differ(rank: int, size: int) -> Any:
    import rdmabuf.distributed as rd

    rd.broadcast(bytearray(100 + rank), src=0)


def source_released(rank: int, size: int) -> Any:
    import rdmabuf.distributed as rd

    with rd.Window(bytearray(4096)) as win:
        if rank == 2:
            win[2].drop().get()  # its owner releases it: readers find nothing
        win.barrier()
        win.broadcast(src=2)


def loopback_across_hosts(rank: int, size: int) -> Any:
    import rdmabuf.distributed as rd

    # As if on hosts of their own, with managers on loopback by choice.
    socket.gethostname = lambda: f"host{rank}"  # type: ignore[assignment]
    os.environ["RDMABUF_LISTEN"] = "127.0.0.1:0"
    rd.Window(bytearray(64))


SCENARIOS: dict[str, Callable[[int, int], Any]] = {
    "patterns": patterns,
    "one_rank_used_rdmabuf_before": one_rank_used_rdmabuf_before,
    "bad_argument_on_one_rank": bad_argument_on_one_rank,
    "output_overlaps_the_window": output_overlaps_the_window,
    "sizes_differ": sizes_differ,
    "source_released": source_released,
    "loopback_across_hosts": loopback_across_hosts,
}
