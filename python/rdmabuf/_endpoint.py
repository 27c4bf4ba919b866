"""Endpoints: a connection to one peer process for two-sided messages, handles,
lent memory and tagged writes (the C++ `rdmabuf::Endpoint`, in the style of
the Rust crate async-rdma).

    # one process
    listener = rdmabuf.listen("0.0.0.0:0")
    send(listener.address)              # any channel
    ep = listener.accept()
    into = bytearray(4096)
    n = ep.receive(into)                # the next message: its size

    # another
    ep = rdmabuf.connect(address)
    ep.send(b"hello")

Messages keep their boundaries and their order; a send waits until the peer
has posted a receive for it (flow control), and a message larger than that
receive fails both calls with InvalidArgumentError (a ValueError), nothing
truncated. Calls block, with the GIL released, until done or their timeout
(seconds; None: the manager's default) passes: DeadlineExceededError (a
TimeoutError). A peer that closes or dies fails them with UnavailableError
(a ConnectionError).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from . import _rdmabuf
from ._buffer import LocalMemory, RDMABuffer
from ._manager import default_manager

__all__ = [
    "listen",
    "connect",
    "next_notification",
    "Listener",
    "Endpoint",
    "PendingReceive",
    "PendingSend",
    "Lease",
    "Notification",
]


class Lease(NamedTuple):
    """Memory a peer lent (`Endpoint.request_remote_buffer`)."""

    buffer: RDMABuffer
    granted: float  # seconds, from when the lender answered


class Notification(NamedTuple):
    """A tagged write (`Endpoint.write`) that has landed in this process's memory."""

    tag: int
    buffer_id: int  # the id of the buffer written (RDMABuffer's handle id)
    offset: int  # the range written, within the registered buffer
    length: int
    peer: str  # "HOST:PORT" of the endpoint it came over


class Endpoint:
    """A connection to one peer process's rdmabuf manager. Thread-safe; use it
    as a context manager, or call `close()`, to end it."""

    __slots__ = ("_ep",)

    def __init__(self, ep: _rdmabuf.Endpoint) -> None:
        self._ep = ep

    # --- Messages -----------------------------------------------------------

    def send(self, data: LocalMemory, *, timeout: Optional[float] = None) -> None:
        """Sends the bytes of `data` (any bytes-like object, bytes included) as
        one message; returns once it is in the receive the peer posted."""
        self._ep.send(data, timeout)

    def receive(self, into: LocalMemory, *, timeout: Optional[float] = None) -> int:
        """Receives the next message into the front of `into` (a writable
        bytes-like object, a numpy array or a CPU tensor): its size. After a
        failure the bytes of `into` are unspecified, but none lands later."""
        return int(self._ep.receive(into, timeout))

    def post_receive(self, into: LocalMemory) -> "PendingReceive":
        """Posts a receive into `into` for a later message, without waiting:
        its credit goes to the peer now, so that several posted receives let
        the peer send that many messages at once. Receives are filled in the
        order they were posted. `into` is held until the wait returns; a
        PendingReceive dropped unwaited is withdrawn (no byte lands
        afterwards, and a message the peer sent before the withdrawal
        reached it may be dropped with it; a wait that times out returns
        such a message instead)."""
        return PendingReceive(self._ep.post_receive(into))

    def post_send(self, data: LocalMemory) -> "PendingSend":
        """Posts `data` as one message without waiting for the peer: posted
        sends take the peer's receives in the order they were posted, so one
        thread can keep a window of messages in flight. `data` is held (and
        must not change) until the wait returns; a PendingSend dropped
        unwaited is cancelled (not sent, if no receive took it yet)."""
        return PendingSend(self._ep.post_send(data))

    # --- Handles and lent memory ---------------------------------------------

    def send_buffer(self, buffer: RDMABuffer, *, timeout: Optional[float] = None) -> None:
        """Passes a handle to the peer, in order with the other handles. Sending
        back a buffer the peer lent returns it (the peer's
        `receive_local_buffer` gets it); this side's access ends."""
        self._ep.send_buffer(buffer._handle, timeout)

    def receive_buffer(self, *, timeout: Optional[float] = None) -> RDMABuffer:
        """The next handle the peer passed (not memory this side lent it)."""
        return RDMABuffer._from_handle(self._ep.receive_buffer(timeout))

    def receive_local_buffer(self, *, timeout: Optional[float] = None) -> memoryview:
        """The next buffer this side lent that the peer sent back: its memory,
        with what the peer wrote, this side's alone again."""
        return self._ep.receive_local_buffer(timeout)

    def request_remote_buffer(
        self, size: int, lease: float, *, timeout: Optional[float] = None
    ) -> Lease:
        """Asks the peer to lend `size` bytes for `lease` seconds (at most its
        maximum lease). When the lease ends, unless renewed, every access to
        the buffer fails with NotFoundError. ResourceExhaustedError when the
        peer's lend limit would be passed."""
        handle, granted = self._ep.request_remote_buffer(size, lease, timeout)
        return Lease(RDMABuffer._from_handle(handle), granted)

    def renew(self, buffer: RDMABuffer, lease: float, *, timeout: Optional[float] = None) -> float:
        """Extends the lease of a buffer the peer lent to `lease` seconds from
        now: the seconds granted. NotFoundError when it has ended already."""
        return float(self._ep.renew(buffer._handle, lease, timeout))

    # --- Tagged writes ---------------------------------------------------------

    def write(
        self, buffer: RDMABuffer, src: LocalMemory, tag: int, *, timeout: Optional[float] = None
    ) -> None:
        """Writes `src` into the front of `buffer` (the peer's) and, once the
        bytes have landed, tells the peer: its `next_notification()` returns
        a Notification with `tag` (0 to 2**32 - 1)."""
        if not 0 <= tag < 1 << 32:
            raise ValueError(f"a tag is 32 bits (0 to {(1 << 32) - 1}), not {tag}")
        self._ep.write(buffer._handle, src, tag, timeout)

    # --- The connection ------------------------------------------------------

    @property
    def peer(self) -> str:
        """The peer's "HOST:PORT", as this side sees it."""
        return str(self._ep.peer)

    @property
    def channel(self) -> str:
        """How the endpoint's frames travel: "shared memory" (same host) or
        "tcp (why not shared memory)"."""
        return str(self._ep.channel)

    def close(self) -> None:
        """Ends the connection: waiting calls fail with CancelledError here and
        UnavailableError at the peer. Idempotent."""
        self._ep.close()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<rdmabuf.Endpoint peer={self.peer} channel={self.channel!r}>"


class PendingReceive:
    """A receive posted with `Endpoint.post_receive`."""

    __slots__ = ("_pending",)

    def __init__(self, pending: _rdmabuf.PendingReceive) -> None:
        self._pending = pending

    def wait(self, *, timeout: Optional[float] = None) -> int:
        """Waits for the message: its size. Errors as `Endpoint.receive`'s; a
        second wait raises FailedPreconditionError. At the timeout the
        receive is withdrawn."""
        return int(self._pending.wait(timeout))


class PendingSend:
    """A send posted with `Endpoint.post_send`."""

    __slots__ = ("_pending",)

    def __init__(self, pending: _rdmabuf.PendingSend) -> None:
        self._pending = pending

    def wait(self, *, timeout: Optional[float] = None) -> None:
        """Waits until the message is in the peer's receive. Errors as
        `Endpoint.send`'s; a second wait raises FailedPreconditionError. At
        the timeout the send is cancelled (cut short, if it was under way:
        the peer's receive then takes the next message)."""
        self._pending.wait(timeout)


class Listener:
    """Where peers connect (`rdmabuf.connect(listener.address)`)."""

    __slots__ = ("_listener",)

    def __init__(self, listener: _rdmabuf.Listener) -> None:
        self._listener = listener

    @property
    def address(self) -> str:
        """The "HOST:PORT" to give to `connect` (the port chosen when 0 was asked)."""
        return str(self._listener.address)

    def accept(self, *, timeout: Optional[float] = None) -> Endpoint:
        """The next peer that connected and completed the handshake. A
        connection that is not an rdmabuf endpoint, goes away midway, or has
        not finished the handshake within 5 s is dropped (a warning in the
        log) and accept waits on.
        DeadlineExceededError when no peer came in time; CancelledError once
        the listener is closed (from another thread too)."""
        return Endpoint(self._listener.accept(timeout))

    def close(self) -> None:
        """Stops listening: later connects are refused and a waiting accept()
        raises CancelledError. Idempotent; endpoints accepted already go on."""
        self._listener.close()

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def listen(address: str = "127.0.0.1:0") -> Listener:
    """Listens for endpoints on "HOST:PORT" (port 0: any free port)."""
    return Listener(default_manager().listen(address))


def connect(address: str, *, timeout: Optional[float] = None) -> Endpoint:
    """Connects an endpoint to the process listening at "HOST:PORT"."""
    return Endpoint(default_manager().connect(address, timeout))


def next_notification(*, timeout: Optional[float] = None) -> Notification:
    """The next tagged write that landed in this process's memory, oldest
    first. DeadlineExceededError when none came in time."""
    return Notification(*default_manager().next_notification(timeout))
