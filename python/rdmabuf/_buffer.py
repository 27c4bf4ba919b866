"""RDMABuffer (a handle to memory some process registered) and RDMAAction (a batch)."""

from __future__ import annotations

import operator
import sys
import warnings
from typing import (
    TYPE_CHECKING,
    Any,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from . import _rdmabuf
from ._errors import InvalidArgumentError, NotFoundError, RDMATcpFallbackWarning
from ._future import Future, completed, notify
from ._manager import default_manager, get_rdma_backend

if sys.version_info >= (3, 11):
    from typing import Self
else:  # pragma: no cover
    from typing_extensions import Self

if TYPE_CHECKING:
    import numpy
    import torch

    # What rdmabuf reads into / writes from / registers: 1-D, contiguous,
    # host memory. Any object with the buffer protocol works (bytes only as a
    # write_from source, being read-only).
    LocalMemory = Union[torch.Tensor, numpy.ndarray, memoryview, bytearray, bytes]
else:
    LocalMemory = Any

__all__ = ["RDMABuffer", "RDMAAction", "Owner", "LocalMemory", "DEFAULT_TIMEOUT"]

# Seconds a transfer may take unless told otherwise (Monarch's default);
# timeout=None means the manager's configured default (RDMABUF_TIMEOUT_MS).
DEFAULT_TIMEOUT = 60.0

# Owners (manager ids) this process has been told about reaching over TCP.
_tcp_owners_warned: Set[int] = set()


class Owner(NamedTuple):
    """Who registered a buffer: the owner process's manager."""

    manager_id: int
    address: str  # "HOST:PORT" of the owner's listener
    host_id: str  # the owner host's boot id
    pid: int
    description: str  # "manager 1a2b… (pid 123 at 127.0.0.1:4000)"

    def __str__(self) -> str:
        return self.description


class RDMABuffer:
    """A handle to memory that a process registered for others to read and write.

    ``RDMABuffer(data)`` registers `data` (a 1-D contiguous torch.Tensor on
    the CPU or a CUDA GPU, numpy array, memoryview, bytearray, or a GPU
    array offering __cuda_array_interface__ or DLPack; writable, since peers
    may write into it) with this process's manager and keeps `data` alive
    until `drop()` or until this object is garbage-collected, whichever comes
    first. Empty, non-contiguous, multi-dimensional or read-only data is a
    ValueError. GPU memory works on every transport (docs/gpu.md); the work
    already queued on a GPU object's stream is waited for before its memory
    is used, and what rdmabuf wrote into it is finished when the call returns.

    Send the buffer to other processes by pickling it (multiprocessing,
    torch.distributed, an actor message) or with `to_bytes()`; what they get
    is a handle: it reads and writes the registered memory but owns nothing,
    and dropping or collecting it never releases the owner's buffer.

    Sizes follow one rule: `read_into(dst)` copies the whole buffer into the
    front of `dst`, so `dst` must be at least `size()` bytes; `write_from(src)`
    copies the whole of `src` into the front of the buffer, so `src` must be
    at most `size()` bytes. Anything else is a ValueError before a byte moves.

    Where no RDMA transport is viable in this process, creating a buffer
    warns with RDMATcpFallbackWarning (peers on other hosts reach it over
    TCP), as does the first transfer to an owner that only TCP reaches.
    """

    __slots__ = ("_handle", "_reg", "_owns", "_dropped", "_route_seen", "__weakref__")

    _handle: _rdmabuf.Handle
    _reg: Optional[_rdmabuf.Registration]
    _owns: bool
    _dropped: bool
    _route_seen: bool

    def __init__(self, data: LocalMemory) -> None:
        reg = default_manager().register(data)
        self._reg = reg
        self._handle = reg.handle
        self._owns = True
        self._dropped = False
        self._route_seen = True  # this process's own buffer
        if get_rdma_backend() == "tcp":
            # One text, so that the default filter shows it once per call site.
            warnings.warn(
                "rdmabuf: no RDMA transport is viable in this process; peers on other hosts "
                "will reach its buffers over TCP (same-host peers use shared memory)",
                RDMATcpFallbackWarning,
                stacklevel=2,
            )

    @classmethod
    def _from_handle(
        cls, handle: _rdmabuf.Handle, keep: Optional[_rdmabuf.Registration] = None
    ) -> "RDMABuffer":
        buf = cls.__new__(cls)
        buf._handle = handle
        buf._reg = keep
        buf._owns = False
        buf._dropped = False
        buf._route_seen = False
        return buf

    # --- What it is ---------------------------------------------------------

    def size(self) -> int:
        """Bytes in the buffer (or in this slice of it)."""
        return self._handle.size

    @property
    def owner(self) -> Owner:
        """The process that registered the memory."""
        return Owner(*self._handle.owner)

    @property
    def is_owner(self) -> bool:
        """True for the object that registered the memory (its drop() releases it)."""
        return self._owns

    @property
    def backends(self) -> List[str]:
        """The transports the owner offers for this buffer, e.g. ["memory", "tcp"]."""
        return list(self._handle.backends)

    @property
    def backend(self) -> str:
        """The transport a transfer on this buffer from this process would take
        now: "memory" (same host), "ibverbs" or "tcp"; "none" when nothing
        can reach the owner (a transfer would fail, saying why)."""
        self._check()
        try:
            return default_manager().transport_for(self._handle)
        except Exception:  # noqa: BLE001 -- any refusal means "none"
            return "none"

    def slice(self, offset: int, length: int) -> "RDMABuffer":
        """A handle to bytes [offset, offset + length) of this buffer. It keeps
        this process's registration alive but, like any handle, releases
        nothing. InvalidArgumentError when the range does not fit."""
        self._check()
        return RDMABuffer._from_handle(self._handle.slice(offset, length), self._reg)

    # --- Transfers ----------------------------------------------------------

    def read_into(
        self, dst: LocalMemory, *, timeout: Optional[float] = DEFAULT_TIMEOUT
    ) -> Future[int]:
        """Copies the whole buffer into the front of `dst` (writable; at least
        `size()` bytes; any dense array or tensor, of any shape and strides:
        the bytes fill its elements in row-major order, in place). Starts at
        once; returns a Future of the bytes moved.
        `timeout` in seconds (None: the configured default, RDMABUF_TIMEOUT_MS)."""
        if self._dropped:
            self._check()
        if not self._route_seen:
            self._see_route()
        return Future(default_manager().read_into(self._handle, dst, timeout, notify()))

    def write_from(
        self, src: LocalMemory, *, timeout: Optional[float] = DEFAULT_TIMEOUT
    ) -> Future[int]:
        """Copies the whole of `src` (at most `size()` bytes; any dense array
        or tensor: its elements in row-major order) into the front of the
        buffer. Starts at once; returns a Future of the bytes moved."""
        if self._dropped:
            self._check()
        if not self._route_seen:
            self._see_route()
        return Future(default_manager().write_from(self._handle, src, timeout, notify()))

    def _see_route(self) -> None:
        """Warns, once per owner, when the owner can be reached only over TCP."""
        self._route_seen = True
        owner = self._handle.owner[0]
        if owner in _tcp_owners_warned or self.backend != "tcp":
            return
        _tcp_owners_warned.add(owner)
        # stacklevel: the user's call, above the method that called this one.
        warnings.warn(
            f"rdmabuf: {self._handle.describe()} is reached over TCP "
            "(no RDMA transport in common with its owner)",
            RDMATcpFallbackWarning,
            stacklevel=3,
        )

    def drop(self) -> Future[None]:
        """Stops sharing the memory; idempotent.

        On the object that registered it: unregisters the buffer (waiting until
        no peer's access is in flight), after which every handle to it fails
        with NotFoundError, and lets go of the data. On a handle (unpickled,
        from_bytes, slice): only makes this object unusable; nothing is
        released. Done when it returns; the returned Future is already
        complete, so ``await buf.drop()`` and ``buf.drop().get()`` also work.
        """
        if not self._dropped:
            self._dropped = True
            reg, self._reg = self._reg, None
            if self._owns and reg is not None:
                reg.drop()
        return completed(None)

    # --- Serialization ------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The handle in rdmabuf's versioned binary form (a few hundred bytes)."""
        self._check()
        return self._handle.to_bytes()

    @classmethod
    def from_bytes(cls, data: Union[bytes, bytearray, memoryview]) -> "RDMABuffer":
        """A handle decoded from `to_bytes()` output. Safe on untrusted input:
        anything malformed is an InvalidArgumentError (a ValueError)."""
        return cls._from_handle(_rdmabuf.Handle.from_bytes(data))

    def to_text(self) -> str:
        """The handle as one line of base64url (what `rdmabuf serve` prints)."""
        self._check()
        return self._handle.to_text()

    @classmethod
    def from_text(cls, text: str) -> "RDMABuffer":
        """A handle decoded from `to_text()` output (surrounding whitespace ignored)."""
        return cls._from_handle(_rdmabuf.Handle.from_text(text))

    def __reduce__(self) -> Tuple[Any, Tuple[bytes]]:
        return (_rebuild, (self.to_bytes(),))

    def __repr__(self) -> str:
        state = " dropped" if self._dropped else (" owner" if self._owns else "")
        return f"<rdmabuf.RDMABuffer {self._handle.describe()}{state}>"

    def _check(self) -> None:
        if self._dropped:
            raise NotFoundError(f"{self._handle.describe()}: this RDMABuffer was dropped")


def _deprecated(old: str, new: str) -> None:
    # stacklevel: the user's call, above the deprecated method.
    warnings.warn(f"{old} is deprecated; use {new}, Monarch's spelling", DeprecationWarning,
                  stacklevel=3)


def _as_buffer(obj: Any, what: str) -> RDMABuffer:
    if not isinstance(obj, RDMABuffer):
        raise TypeError(
            f"{what} must be an RDMABuffer, not {type(obj).__name__} "
            "(read_remote(dst, src) takes local memory first, write_remote(dst, src) "
            "the buffer first)"
        )
    obj._check()
    return obj


def _rebuild(data: bytes) -> RDMABuffer:
    """Unpickles an RDMABuffer: decodes the handle's bytes, nothing else."""
    return RDMABuffer.from_bytes(data)


# An op of an RDMAAction as the compiled layer takes it: (kind, handle,
# local memory, operand, compare), kind as in rdmabuf::OpKind.
_Range = Tuple[int, int, int]
_OpSpec = Tuple[int, "_rdmabuf.Handle", Any, int, int, Optional[List[_Range]]]
_READ, _WRITE, _FETCH_ADD, _COMPARE_AND_SWAP = 0, 1, 2, 3
_WORD = 8


def _as_word_value(value: int, what: str) -> int:
    """`value` as an unsigned 64-bit word: -2**63 <= value < 2**64, wrapped."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not -(1 << 63) <= value < (1 << 64):
        raise InvalidArgumentError(f"{what}={value} does not fit in a 64-bit word")
    return value & ((1 << 64) - 1)


def _atomic_op(kind: int, name: str, src: RDMABuffer, dst: LocalMemory, operand: int,
               compare: int) -> _OpSpec:
    src = _as_buffer(src, f"{name}: src")
    if src.size() != _WORD:
        raise InvalidArgumentError(
            f"{name}: src must be one 8-byte word (e.g. buf.slice(offset, 8)), "
            f"not {src.size()} B"
        )
    size = _rdmabuf.local_size(dst, True, False)
    if size < _WORD:
        raise InvalidArgumentError(f"{name}: dst holds {size} B, less than the word's 8 B")
    operand = _as_word_value(operand, "add" if kind == _FETCH_ADD else "swap")
    compare = _as_word_value(compare, "compare")
    return (kind, src._handle, dst, operand, compare, None)


def _as_ranges(ranges: Any, name: str, remote_size: int, local_size: int) -> List[_Range]:
    """`ranges` as (remote offset, local offset, length) triples of ints, each
    within both sides (InvalidArgumentError otherwise)."""
    out: List[_Range] = []
    for k, item in enumerate(ranges):
        try:
            remote, local, length = (operator.index(x) for x in item)
        except (TypeError, ValueError):
            raise TypeError(
                f"{name}: ranges[{k}] must be a (remote offset, local offset, length) "
                f"triple of ints, not {item!r}"
            ) from None
        if length <= 0 or remote < 0 or local < 0:
            raise InvalidArgumentError(f"{name}: ranges[{k}] = {item!r} is empty or negative")
        if remote + length > remote_size:
            raise InvalidArgumentError(
                f"{name}: ranges[{k}] = {item!r} ends past the buffer's {remote_size} B"
            )
        if local + length > local_size:
            raise InvalidArgumentError(
                f"{name}: ranges[{k}] = {item!r} ends past the local memory's {local_size} B"
            )
        out.append((remote, local, length))
    if not out:
        raise InvalidArgumentError(f"{name}: ranges is empty")
    return out


class RDMAAction:
    """A batch of reads, writes and atomics submitted at once (Monarch's RDMAAction).

    ``RDMAAction().read_remote(dst, buf).write_remote(buf2, src).submit()``:
    every op starts together when submitted; ops to one owner are pipelined
    on its connections, ops to different owners run concurrently. The Future
    resolves to None when every op succeeded, or raises the error of the
    first failed op (by position, in `op_index`); the other ops still ran.
    Sizes are checked when an op is added (ValueError), local memory again at
    submit, where a read into memory that another op of the batch also uses
    is a ValueError. An action may be submitted again: each submit runs the
    same ops again, on the memory as it is then.
    """

    __slots__ = ("_ops",)

    def __init__(self) -> None:
        self._ops: List[_OpSpec] = []

    def read_remote(
        self, dst: LocalMemory, src: RDMABuffer, *, ranges: Optional[Sequence[_Range]] = None
    ) -> Self:
        """Adds a read of the whole of remote `src` into the front of local `dst`.

        `dst` may be any dense array or tensor, of any shape and strides
        (every other row of a matrix, ``t[::2]``; a transposed view): the
        bytes fill its elements in row-major order, straight into their
        places in memory, with no contiguous copy in between.

        `ranges`: a list of ``(remote offset, local offset, length)`` in
        bytes, relative to `src` (a buffer, or a slice of one) and to `dst`
        (contiguous), read instead of the whole buffer: one op that moves
        them all (a KV cache's pages, rows of many tensors), with one status.
        No two may overlap in `dst`."""
        src = _as_buffer(src, "read_remote: src")
        if not src._route_seen:
            src._see_route()
        size = _rdmabuf.local_size(dst, True)
        if ranges is not None:
            spec = _as_ranges(ranges, "read_remote", src.size(), size)
            self._ops.append((_READ, src._handle, dst, 0, 0, spec))
            return self
        if size < src.size():
            raise InvalidArgumentError(
                f"read_remote: dst holds {size} B, less than the buffer's {src.size()} B"
            )
        self._ops.append((_READ, src._handle, dst, 0, 0, None))
        return self

    def write_remote(
        self, dst: RDMABuffer, src: LocalMemory, *, ranges: Optional[Sequence[_Range]] = None
    ) -> Self:
        """Adds a write of the whole of local `src` into the front of remote `dst`.

        `src` may be any dense array or tensor, as for read_remote: its
        elements in row-major order are sent. `ranges`: as for read_remote
        (offsets into `dst` and into `src`); no two may overlap on either
        side."""
        dst = _as_buffer(dst, "write_remote: dst")
        if not dst._route_seen:
            dst._see_route()
        size = _rdmabuf.local_size(src, False)
        if ranges is not None:
            spec = _as_ranges(ranges, "write_remote", dst.size(), size)
            self._ops.append((_WRITE, dst._handle, src, 0, 0, spec))
            return self
        if size > dst.size():
            raise InvalidArgumentError(
                f"write_remote: src holds {size} B, more than the buffer's {dst.size()} B"
            )
        self._ops.append((_WRITE, dst._handle, src, 0, 0, None))
        return self

    def fetch_add(self, src: RDMABuffer, dst: LocalMemory, add: int) -> Self:
        """Adds a remote fetch-and-add (Monarch's signature): adds `add` to the
        8-byte word `src` (8 bytes of a buffer at an offset that is a multiple
        of 8, e.g. ``buf.slice(16, 8)``) and puts the word's previous value in
        the first 8 bytes of `dst` (host memory, native byte order: e.g. a
        one-element torch.int64 tensor or numpy.uint64 array). The word is an
        unsigned 64-bit integer: `add` wraps modulo 2**64, so a negative one
        subtracts. Atomic with every other rdmabuf atomic on the word, from
        any process (see docs/atomics.md)."""
        self._ops.append(_atomic_op(_FETCH_ADD, "fetch_add", src, dst, add, 0))
        return self

    def compare_and_swap(
        self, src: RDMABuffer, dst: LocalMemory, compare: int, swap: int
    ) -> Self:
        """Adds a remote compare-and-swap (Monarch's signature): sets the
        8-byte word `src` to `swap` if it equals `compare`, and puts the word's
        previous value in the first 8 bytes of `dst` (it equals `compare`
        exactly when the swap happened). The rules of fetch_add apply."""
        self._ops.append(_atomic_op(_COMPARE_AND_SWAP, "compare_and_swap", src, dst, swap, compare))
        return self

    def read_into(self, buf: RDMABuffer, dst: LocalMemory) -> Self:
        """Deprecated spelling of ``read_remote(dst, buf)`` (note the order)."""
        _deprecated("RDMAAction.read_into(buf, dst)", "read_remote(dst, buf)")
        return self.read_remote(dst, buf)

    def write_from(self, buf: RDMABuffer, src: LocalMemory) -> Self:
        """Deprecated spelling of ``write_remote(buf, src)``."""
        _deprecated("RDMAAction.write_from(buf, src)", "write_remote(buf, src)")
        return self.write_remote(buf, src)

    def __len__(self) -> int:
        return len(self._ops)

    def submit(self, *, timeout: Optional[float] = DEFAULT_TIMEOUT) -> Future[None]:
        """Starts every op; `timeout` (seconds; None: the configured default)
        bounds the whole batch."""
        return Future(default_manager().submit(list(self._ops), timeout, notify()))
