"""A job run by torchrun across hosts (tests/hosts/test_hosts.py): each
pattern of rdmabuf.distributed with its bytes checked, and the transport
each peer is reached by. Prints "rank R ok BACKENDS" when all is well."""

import socket
import sys
import warnings

import torch
import torch.distributed as dist

import rdmabuf
import rdmabuf.distributed as rd

warnings.simplefilter("ignore", rdmabuf.RDMATcpFallbackWarning)
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()

# broadcast: rank 0's weights, 4 MiB of float32, reach every rank.
weights = torch.arange(1 << 20, dtype=torch.float32) if rank == 0 else torch.zeros(1 << 20)
rd.broadcast(weights, src=0)
assert torch.equal(weights, torch.arange(1 << 20, dtype=torch.float32)), f"rank {rank}: broadcast"

# all_to_all: chunk j of rank i's input lands in chunk i of rank j's output.
chunk = 1 << 14
sent = torch.arange(size * chunk, dtype=torch.int64) + (rank << 40)
got = torch.zeros_like(sent)
rd.all_to_all(got, sent)
want = torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk) + (i << 40) for i in range(size)])
assert torch.equal(got, want), f"rank {rank}: all_to_all"

# gather into the last rank.
last = size - 1
out = torch.zeros(size * 1000, dtype=torch.int32) if rank == last else None
rd.gather(torch.full((1000,), rank, dtype=torch.int32), out, dst=last)
if rank == last:
    assert torch.equal(out, torch.arange(size).repeat_interleave(1000).int()), "gather"

# A window used one-sidedly, many times: each rank reads its neighbour's.
hosts = [None] * size
dist.all_gather_object(hosts, socket.gethostname())
with rd.Window(torch.full((1 << 16,), rank, dtype=torch.uint8)) as win:
    backends = []
    for peer in range(size):
        dst = torch.empty(1 << 10, dtype=torch.uint8)
        win.read(peer, dst, offset=1 << 12).get()
        assert bool((dst == peer).all()), f"rank {rank}: read from {peer}"
        backends.append(win[peer].backend)
    for peer in range(size):  # another host: tcp; this host: memory
        expected = "memory" if hosts[peer] == hosts[rank] else "tcp"
        assert backends[peer] == expected, (rank, peer, backends, hosts)
    win.barrier()
# One write, line and newline: the ranks share the pipe, and print() under
# PYTHONUNBUFFERED writes the newline apart, so two ranks' lines could merge.
sys.stdout.write(f"rank {rank} on {socket.gethostname()} ok {','.join(backends)}\n")
sys.stdout.flush()
dist.destroy_process_group()
