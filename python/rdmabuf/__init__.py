"""rdmabuf: one-sided access to another process's memory, from Python.

A process registers memory (a torch tensor, numpy array, memoryview or
bytearray) as an `RDMABuffer` and sends the buffer to other processes by
pickling it; they read that memory into their own (`read_into`) or write
their own into it (`write_from`) without the owner's code taking part.
Transfers return a `Future`: ``await`` it from asyncio, or ``.get()`` it.
Processes that also need to talk connect an `Endpoint` (`listen` /
`connect`): messages, handles, lent memory and tagged writes.

    import rdmabuf, torch

    # owner
    weights = torch.zeros(1 << 20)
    buf = rdmabuf.RDMABuffer(weights.view(torch.uint8))
    send(pickle.dumps(buf))          # any channel

    # reader, in another process
    buf = pickle.loads(received)
    dst = torch.empty(buf.size(), dtype=torch.uint8)
    buf.read_into(dst).get()         # or: await buf.read_into(dst)

The API is PyTorch Monarch's ``monarch.rdma`` (RDMABuffer, RDMAAction with
read_remote / write_remote / submit, get_rdma_backend, is_ibverbs_available,
is_rdma_available, RDMATcpFallbackWarning; docs/monarch.md maps every name),
with rdmabuf's extras beside it (among them `empty`: a tensor or array in
memory that same-host peers copy at memory speed). Transfers time out after
60 s unless told otherwise. Errors are `rdmabuf.Error` subclasses carrying
the status code and message; size mismatches and bad data are also
ValueError, timeouts also TimeoutError.
"""

from ._errors import (
    CancelledError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ProtocolError,
    ResourceExhaustedError,
    RDMATcpFallbackWarning,
    StatusCode,
    UnavailableError,
    UnimplementedError,
)
from ._buffer import DEFAULT_TIMEOUT, LocalMemory, Owner, RDMAAction, RDMABuffer
from ._empty import empty
from ._endpoint import (
    Endpoint,
    Lease,
    Listener,
    Notification,
    PendingReceive,
    PendingSend,
    connect,
    listen,
    next_notification,
)
from ._future import Future
from ._manager import (
    BackendInfo,
    Config,
    backends,
    config,
    configure,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
    shutdown,
)
from ._rdmabuf import version as _version

__version__: str = _version()

__all__ = [
    "RDMABuffer",
    "RDMAAction",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
    "RDMATcpFallbackWarning",
    "DEFAULT_TIMEOUT",
    "Future",
    "Owner",
    "LocalMemory",
    "empty",
    "listen",
    "connect",
    "next_notification",
    "Listener",
    "Endpoint",
    "PendingReceive",
    "PendingSend",
    "Lease",
    "Notification",
    "backends",
    "BackendInfo",
    "configure",
    "config",
    "Config",
    "shutdown",
    "StatusCode",
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "DeadlineExceededError",
    "CancelledError",
    "UnavailableError",
    "ProtocolError",
    "FailedPreconditionError",
    "ResourceExhaustedError",
    "UnimplementedError",
    "InternalError",
]
