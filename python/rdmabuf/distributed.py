"""rdmabuf across the ranks of a job: each rank's tensor shared with the
others over a torch.distributed process group (torchrun, Slurm) or an MPI
communicator (mpirun with mpi4py), and the common patterns one call each.

    import torch.distributed as dist
    import rdmabuf.distributed as rd

    dist.init_process_group("gloo")      # torchrun set the environment
    rd.broadcast(weights, src=0)         # every rank reads rank 0's weights

    with rd.Window(kv_pages) as win:     # registered once, handles shared
        win.read(peer, dst).get()        # one-sided: the peer's code takes no part
        win.all_to_all(out)              # collectives reuse the registration

Collective calls (Window(), broadcast, all_to_all, gather, barrier, close)
are made by every rank of the group in the same order, like the
torch.distributed calls they stand for. The bytes move by one-sided reads
over rdmabuf's transports (same-host memory, ibverbs, tcp); the group
carries only handles, barriers and a status word per rank, and every rank
raises the same error when any rank's reads failed.

Reachability: a manager listens on loopback unless told otherwise
(RDMABUF_LISTEN). When a window's group spans hosts and this process's
manager is not in use yet, it is made to listen on the address that routes
to the group's rendezvous (MASTER_ADDR, which torchrun sets) or to rank 0's
host; a manager that already listens on loopback in such a group is a
FailedPreconditionError on every rank, naming RDMABUF_LISTEN.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any, Callable, List, Optional, Tuple

from . import _rdmabuf
from ._buffer import DEFAULT_TIMEOUT, LocalMemory, RDMAAction, RDMABuffer
from ._errors import (
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    StatusCode,
    error_for,
)
from ._manager import config, configure, manager_in_use

__all__ = ["Window", "broadcast", "all_to_all", "gather"]


# --- Groups ------------------------------------------------------------------


class _Group:
    """What a window needs of a process group: rank, size, an all-gather of
    small picklable objects, and a barrier."""

    rank: int
    size: int

    def all_gather(self, obj: Any) -> List[Any]:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError


class _TorchGroup(_Group):
    def __init__(self, dist: Any, group: Any) -> None:
        self._dist = dist
        self._group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def all_gather(self, obj: Any) -> List[Any]:
        out: List[Any] = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self._group)
        return out

    def barrier(self) -> None:
        self._dist.barrier(group=self._group)


class _MpiGroup(_Group):
    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def all_gather(self, obj: Any) -> List[Any]:
        return list(self._comm.allgather(obj))

    def barrier(self) -> None:
        self._comm.Barrier()


def _as_group(group: Any) -> _Group:
    """A torch.distributed group (None: the default one), or an mpi4py
    communicator; with neither initialized and group None, MPI's
    COMM_WORLD when mpi4py.MPI is imported."""
    if group is not None and hasattr(group, "Get_rank") and hasattr(group, "allgather"):
        return _MpiGroup(group)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return _TorchGroup(dist, group)
    mpi = sys.modules.get("mpi4py.MPI")
    if group is None and mpi is not None:
        return _MpiGroup(mpi.COMM_WORLD)
    raise FailedPreconditionError(
        "rdmabuf.distributed: no process group: call torch.distributed.init_process_group() "
        "first (torchrun sets its environment), or pass an mpi4py communicator"
    )


# --- Reachability --------------------------------------------------------------


def _route_to(host: str) -> Optional[str]:
    """This host's address on the route to `host` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def _make_reachable(group: _Group) -> List[str]:
    """Before this process's manager starts: when the group spans hosts and
    nothing configured where it listens, listen where the others can dial.
    Collective (every rank gathers the host names, whatever it decides);
    returns them, in rank order."""
    hosts = group.all_gather(socket.gethostname())
    if len(set(hosts)) == 1 or manager_in_use() or "RDMABUF_LISTEN" in os.environ:
        return hosts  # one host; or too late, or loopback on purpose: Window checks
    if not config().listen.startswith("127."):
        return hosts  # configure(listen=...) chose an address
    toward = os.environ.get("MASTER_ADDR") or hosts[0]
    address = _route_to(toward)
    if address is None or address.startswith("127."):
        address = "0.0.0.0"  # every interface; handles name the first non-loopback one
    configure(listen=f"{address}:0")
    return hosts


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("localhost", "::1")


# --- Memory --------------------------------------------------------------------


def _flat_bytes(data: LocalMemory) -> Any:
    """`data` (contiguous: a tensor, an array, a buffer) as a 1-D view of its
    bytes, sliceable by byte offset."""
    if hasattr(data, "is_contiguous") and hasattr(data, "view"):  # torch.Tensor
        if not data.is_contiguous():
            raise InvalidArgumentError("rdmabuf.distributed: the tensor must be contiguous")
        import torch

        return data.reshape(-1).view(torch.uint8)
    if hasattr(data, "__array_interface__") and hasattr(data, "reshape"):  # numpy
        if not data.flags["C_CONTIGUOUS"]:
            raise InvalidArgumentError("rdmabuf.distributed: the array must be contiguous")
        return data.reshape(-1).view("u1")
    return memoryview(data).cast("B")


def _nbytes(view: Any) -> int:
    """Bytes in a view from _flat_bytes (torch 1.x tensors have no nbytes)."""
    return int(view.numel() if hasattr(view, "numel") else view.nbytes)


def _overlap(a: Tuple[int, int], b: Tuple[int, int]) -> bool:
    """Whether two spans (address, bytes) from local_span share a byte."""
    (a_start, a_size), (b_start, b_size) = a, b
    return a_size > 0 and b_size > 0 and a_start < b_start + b_size and b_start < a_start + a_size


# --- Window --------------------------------------------------------------------


class Window:
    """One tensor (or array, or buffer) of every rank in a group, each
    registered by its rank and reachable by all: ``win[r]`` is rank r's as
    an RDMABuffer. Creating one is collective (each rank registers its own,
    then the handles are all-gathered); so are barrier(), the patterns and
    close(). read() and write() are one-sided: only the caller takes part.

    The memory stays registered until close() (or the end of a `with`
    block); a rank must not change its memory while others may read it
    (the patterns end with every rank's reads done).
    """

    def __init__(self, data: LocalMemory, group: Any = None, *,
                 timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:  # fmt: skip
        self._group = _as_group(group)
        self._timeout = timeout
        self._bytes = _flat_bytes(data)
        hosts = set(_make_reachable(self._group))
        self._mine: Optional[RDMABuffer] = RDMABuffer(self._bytes)
        self._span = _rdmabuf.local_span(self._bytes)  # where outputs must not lie
        handles = self._group.all_gather(self._mine.to_bytes())
        self._buffers: List[RDMABuffer] = [
            self._mine if r == self.rank else RDMABuffer.from_bytes(b)
            for r, b in enumerate(handles)
        ]
        if len(hosts) > 1:
            stuck = [r for r, b in enumerate(self._buffers) if _is_loopback(b.owner.address)]
            if stuck:
                self._mine.drop().get()
                raise FailedPreconditionError(
                    f"rdmabuf.distributed: the group spans {len(hosts)} hosts, but rank "
                    f"{stuck[0]}'s manager listens on loopback only "
                    f"({self._buffers[stuck[0]].owner.address}); set RDMABUF_LISTEN=0.0.0.0:0, "
                    "or make the window before that process uses rdmabuf otherwise"
                )

    @property
    def rank(self) -> int:
        return self._group.rank

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return self._group.size

    def __len__(self) -> int:
        return self._group.size

    def __getitem__(self, rank: int) -> RDMABuffer:
        return self._buffers[rank]

    def nbytes(self, rank: int) -> int:
        """Bytes rank `rank` shares."""
        return self._buffers[rank].size()

    # --- One-sided ---------------------------------------------------------

    def read(self, rank: int, dst: LocalMemory, *, offset: int = 0) -> Any:
        """Reads len(dst) bytes of rank `rank`'s memory, from `offset`, into
        `dst`; returns a Future. One-sided."""
        return self._slice(rank, offset, _nbytes(_flat_bytes(dst))).read_into(
            dst, timeout=self._timeout
        )

    def write(self, rank: int, src: LocalMemory, *, offset: int = 0) -> Any:
        """Writes `src` into rank `rank`'s memory at `offset`; returns a
        Future. One-sided: the owner learns of it from the program (a
        barrier, a message)."""
        return self._slice(rank, offset, _nbytes(_flat_bytes(src))).write_from(
            src, timeout=self._timeout
        )

    def _slice(self, rank: int, offset: int, length: int) -> RDMABuffer:
        self._check_open()
        self._check_rank(rank, "Window")
        return self._buffers[rank].slice(offset, length)

    # --- Collective ----------------------------------------------------------

    def barrier(self) -> None:
        """Returns when every rank has called it."""
        self._group.barrier()

    def broadcast(self, src: int = 0) -> None:
        """Every rank's memory becomes a copy of rank `src`'s: the others
        each read it (the same size on every rank)."""
        self._run(lambda: self._broadcast_reads(src))

    def all_to_all(self, output: LocalMemory) -> None:
        """Each rank's memory is `size` equal chunks; chunk j goes to rank j.
        `output` (as many bytes as this rank's memory, and not overlapping
        it) receives in chunk i what rank i had in chunk `rank`. This rank
        reads its chunk of every rank's memory, its own included."""
        self._run(lambda: self._all_to_all_reads(output))

    def gather(self, output: Optional[LocalMemory] = None, dst: int = 0) -> None:
        """Rank `dst` reads every rank's memory into `output` (its own
        included, so not overlapping it), rank r's at r times the size; the
        other ranks pass no output and only wait."""
        self._run(lambda: self._gather_reads(output, dst))

    def _broadcast_reads(self, src: int) -> RDMAAction:
        self._same_sizes("broadcast")
        self._check_rank(src, "broadcast: src")
        action = RDMAAction()
        if self.rank != src:
            action.read_remote(self._bytes, self._buffers[src])
        return action

    def _all_to_all_reads(self, output: LocalMemory) -> RDMAAction:
        self._same_sizes("all_to_all")
        out = _flat_bytes(output)
        total = self.nbytes(self.rank)
        if total % self.size or _nbytes(out) != total:
            raise InvalidArgumentError(
                f"rdmabuf.distributed.all_to_all: {total} B must split into {self.size} equal "
                f"chunks and output must hold {total} B (it holds {_nbytes(out)} B)"
            )
        self._output_apart(out, "all_to_all")
        chunk = total // self.size
        action = RDMAAction()
        for r in range(self.size):
            src = self._buffers[r].slice(self.rank * chunk, chunk)
            action.read_remote(out[r * chunk : (r + 1) * chunk], src)
        return action

    def _gather_reads(self, output: Optional[LocalMemory], dst: int) -> RDMAAction:
        self._same_sizes("gather")
        self._check_rank(dst, "gather: dst")
        action = RDMAAction()
        if self.rank != dst:
            return action
        if output is None:
            raise InvalidArgumentError("rdmabuf.distributed.gather: rank dst needs an output")
        out = _flat_bytes(output)
        each = self.nbytes(dst)
        if _nbytes(out) < each * self.size:
            raise InvalidArgumentError(
                f"rdmabuf.distributed.gather: output holds {_nbytes(out)} B, "
                f"less than {self.size} x {each} B"
            )
        self._output_apart(out, "gather")
        for r in range(self.size):
            action.read_remote(out[r * each : (r + 1) * each], self._buffers[r])
        return action

    def close(self) -> None:
        """Collective: after every rank is done, each releases its memory.
        Idempotent."""
        if self._mine is None:
            return
        self._group.barrier()
        mine, self._mine = self._mine, None
        mine.drop().get()

    def __enter__(self) -> "Window":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, plan: Callable[[], RDMAAction]) -> None:
        """A pattern's step, the same collectives on every rank whatever
        happens on one: a barrier (every rank's memory is ready), this
        rank's reads (`plan` makes them; an error there, such as a bad
        argument on this rank alone, counts as this rank's failure), then
        every rank's status gathered (everyone's reads are done), raising
        on every rank if any rank's failed."""
        self._group.barrier()
        failure: Optional[Tuple[int, str]] = None
        try:
            self._check_open()
            action = plan()
            if len(action):
                action.submit(timeout=self._timeout).get()
        except Error as e:
            failure = (int(e.code), e.message)
        except (ValueError, TypeError, IndexError) as e:
            failure = (int(StatusCode.INVALID_ARGUMENT), f"{type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 -- every rank must hear of it
            failure = (int(StatusCode.INTERNAL), f"{type(e).__name__}: {e}")
        statuses = self._group.all_gather(failure)
        for rank, status in enumerate(statuses):
            if status is not None:
                code, message = status
                raise error_for(StatusCode(code), f"rank {rank}: {message}")

    def _check_rank(self, rank: int, what: str) -> None:
        if not 0 <= rank < self.size:
            raise InvalidArgumentError(f"rdmabuf.distributed.{what}: no rank {rank} of {self.size}")

    def _same_sizes(self, what: str) -> None:
        sizes = {b.size() for b in self._buffers}
        if len(sizes) != 1:
            raise InvalidArgumentError(
                f"rdmabuf.distributed.{what}: every rank must share the same number of bytes "
                f"(they share {sorted(sizes)})"
            )

    def _output_apart(self, out: Any, what: str) -> None:
        """An output that overlaps this rank's memory would be written while
        it is read (by this rank, or by the others)."""
        if _overlap(_rdmabuf.local_span(out), self._span):
            raise InvalidArgumentError(
                f"rdmabuf.distributed.{what}: output overlaps this rank's memory in the window, "
                "which is read while output is written; give it memory of its own"
            )

    def _check_open(self) -> None:
        if self._mine is None:
            raise FailedPreconditionError("rdmabuf.distributed: the window is closed")


# --- One call each ---------------------------------------------------------------


def broadcast(data: LocalMemory, src: int = 0, group: Any = None) -> None:
    """Every rank's `data` becomes a copy of rank `src`'s, by one-sided
    reads (collective; torch.distributed.broadcast's meaning). To repeat
    it, keep a Window: this registers and shares the memory each call."""
    with Window(data, group) as win:
        win.broadcast(src)


def all_to_all(output: LocalMemory, input: LocalMemory, group: Any = None) -> None:
    """Chunk j of each rank's `input` lands in chunk `rank` of rank j's
    `output` (collective; equal chunks, torch's all_to_all_single)."""
    with Window(input, group) as win:
        win.all_to_all(output)


def gather(data: LocalMemory, output: Optional[LocalMemory] = None, dst: int = 0,
           group: Any = None) -> None:  # fmt: skip
    """Rank `dst` gets every rank's `data` in `output`, in rank order
    (collective; the others pass no output)."""
    with Window(data, group) as win:
        win.gather(output, dst)

