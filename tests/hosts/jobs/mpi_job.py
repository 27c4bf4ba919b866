"""A job run by mpirun across hosts (tests/hosts/test_hosts.py), with
mpi4py: rdmabuf.distributed over an MPI communicator, bytes checked.
Prints "rank R ok BACKENDS" when all is well."""

import socket
import sys
import warnings

import numpy as np
from mpi4py import MPI

import rdmabuf
import rdmabuf.distributed as rd

warnings.simplefilter("ignore", rdmabuf.RDMATcpFallbackWarning)
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

weights = np.arange(1 << 20, dtype=np.float32) if rank == 0 else np.zeros(1 << 20, np.float32)
rd.broadcast(weights, src=0, group=comm)
assert (weights == np.arange(1 << 20, dtype=np.float32)).all(), f"rank {rank}: broadcast"

chunk = 1 << 12
sent = np.arange(size * chunk, dtype=np.int64) + (rank << 40)
got = np.zeros_like(sent)
rd.all_to_all(got, sent, group=comm)
want = np.concatenate([np.arange(rank * chunk, (rank + 1) * chunk) + (i << 40) for i in range(size)])
assert (got == want).all(), f"rank {rank}: all_to_all"

out = np.zeros(size * 100, np.int32) if rank == 0 else None
rd.gather(np.full(100, rank, np.int32), out, dst=0, group=comm)
if rank == 0:
    assert (out == np.repeat(np.arange(size), 100)).all(), "gather"

hosts = comm.allgather(socket.gethostname())
with rd.Window(np.full(4096, rank, np.uint8), comm) as win:
    backends = [win[peer].backend for peer in range(size)]
    for peer in range(size):
        dst = np.empty(256, np.uint8)
        win.read(peer, dst, offset=512).get()
        assert (dst == peer).all(), f"rank {rank}: read from {peer}"
        assert backends[peer] == ("memory" if hosts[peer] == hosts[rank] else "tcp"), backends
# One write, line and newline: the ranks share the pipe, and print() under
# PYTHONUNBUFFERED writes the newline apart, so two ranks' lines could merge.
sys.stdout.write(f"rank {rank} on {socket.gethostname()} ok {','.join(backends)}\n")
sys.stdout.flush()
