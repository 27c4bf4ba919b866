"""rdmabuf's exceptions: one base class, `Error`, and one subclass per status code.

Every failure the library reports (a C++ `rdmabuf::Status`) is raised as the
subclass for its code, carrying `.code` and `.message`. Some also derive from
the built-in exception Python programs already catch for that situation:

    InvalidArgumentError   ValueError         sizes that do not fit, bad data, bad handle
    DeadlineExceededError  TimeoutError       the op did not finish in time
    UnavailableError       ConnectionError    the owner cannot be reached
    PermissionDeniedError  PermissionError    the handle's token does not match
    UnimplementedError     NotImplementedError  e.g. a tensor on an XPU or MPS device
"""

from __future__ import annotations

import enum
from typing import Dict, Optional, Type

from . import _rdmabuf

__all__ = [
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
    "RDMATcpFallbackWarning",
]


class StatusCode(enum.IntEnum):
    """The status codes of rdmabuf (the same numbers as `rdmabuf::StatusCode`)."""

    OK = 0
    INVALID_ARGUMENT = 1
    NOT_FOUND = 2
    PERMISSION_DENIED = 3
    DEADLINE_EXCEEDED = 4
    CANCELLED = 5
    UNAVAILABLE = 6
    PROTOCOL_ERROR = 7
    FAILED_PRECONDITION = 8
    RESOURCE_EXHAUSTED = 9
    UNIMPLEMENTED = 10
    INTERNAL = 11

    @property
    def label(self) -> str:
        """The code's name as the C++ library and the README spell it, e.g. "NotFound"."""
        return _rdmabuf.status_code_name(int(self))

    @property
    def retryable(self) -> bool:
        """Whether retrying the same call can succeed (see the README's error table)."""
        return _rdmabuf.is_retryable(int(self))


class Error(Exception):
    """A failure reported by rdmabuf: `code` (a StatusCode) and `message`.

    The message names the op, the buffer, the peer and the cause. For a
    failed op of an `RDMAAction`, `op_index` is the op's position in the
    action; otherwise it is None.
    """

    _default_code = StatusCode.INTERNAL

    code: StatusCode
    message: str
    op_index: Optional[int]

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        # One argument for the base classes: OSError subclasses would read
        # two as (errno, strerror).
        super().__init__(message)
        self.code = StatusCode(self._default_code if code is None else code)
        self.message = message
        self.op_index = None

    @property
    def retryable(self) -> bool:
        """Whether retrying the same call can succeed."""
        return self.code.retryable

    def __str__(self) -> str:
        return f"{self.code.label}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code.name})"

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Picklable as (class, message, code), e.g. to report from a worker process.
        return (_rebuild_error, (type(self), self.message, int(self.code), self.op_index))


def _rebuild_error(cls: Type[Error], message: str, code: int, op_index: Optional[int]) -> Error:
    error = cls(message, code)
    error.op_index = op_index
    return error


class InvalidArgumentError(Error, ValueError):
    """A range out of bounds, sizes that do not fit, data that is not 1-D,
    contiguous or writable, a malformed handle, a bad configuration value.
    Nothing was transferred."""

    _default_code = StatusCode.INVALID_ARGUMENT


class NotFoundError(Error):
    """The buffer is unknown to its owner: dropped (released), or its owner
    restarted. Get a fresh handle."""

    _default_code = StatusCode.NOT_FOUND


class PermissionDeniedError(Error, PermissionError):
    """The handle's token does not match the buffer (forged or altered)."""

    _default_code = StatusCode.PERMISSION_DENIED


class DeadlineExceededError(Error, TimeoutError):
    """The op did not finish within its timeout. Its local memory is no longer
    touched; the remote range of a write is unspecified. Retrying with a
    longer timeout may help."""

    _default_code = StatusCode.DEADLINE_EXCEEDED


class CancelledError(Error):
    """The op was cancelled: by the caller (Future.cancel, a cancelled asyncio
    task awaiting it) or by the manager shutting down. Not asyncio's
    CancelledError."""

    _default_code = StatusCode.CANCELLED


class UnavailableError(Error, ConnectionError):
    """The owner could not be reached, or the connection broke mid-op. A retry
    opens a new connection."""

    _default_code = StatusCode.UNAVAILABLE


class ProtocolError(Error):
    """The peer broke the wire protocol; the connection was dropped. A retry
    opens a new connection."""

    _default_code = StatusCode.PROTOCOL_ERROR


class FailedPreconditionError(Error):
    """No usable transport (e.g. TCP needed but fallback disabled), the manager
    is shut down, or it was configured too late. Change the configuration."""

    _default_code = StatusCode.FAILED_PRECONDITION


class ResourceExhaustedError(Error):
    """A limit was reached (connections, sizes, memory)."""

    _default_code = StatusCode.RESOURCE_EXHAUSTED


class UnimplementedError(Error, NotImplementedError):
    """Something rdmabuf does not support (e.g. memory of a device other than a CUDA GPU)."""

    _default_code = StatusCode.UNIMPLEMENTED


class InternalError(Error):
    """A bug in rdmabuf, or a system call that should not fail."""

    _default_code = StatusCode.INTERNAL


ERROR_TYPES: Dict[StatusCode, Type[Error]] = {
    cls._default_code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        PermissionDeniedError,
        DeadlineExceededError,
        CancelledError,
        UnavailableError,
        ProtocolError,
        FailedPreconditionError,
        ResourceExhaustedError,
        UnimplementedError,
        InternalError,
    )
}

_rdmabuf.set_error_types({int(code): cls for code, cls in ERROR_TYPES.items()})


def error_for(code: StatusCode, message: str) -> Error:
    """The exception rdmabuf raises for `code`."""
    return ERROR_TYPES.get(code, Error)(message, code)


class RDMATcpFallbackWarning(Warning):
    """Bytes will move over TCP, not RDMA: warned when a buffer is created in
    a process where no RDMA transport is viable (peers on other hosts can
    reach it only over TCP), and when this process first reaches a buffer of
    some owner over TCP. Silence it with ``warnings.filterwarnings("ignore",
    category=rdmabuf.RDMATcpFallbackWarning)``, or forbid the fallback with
    ``configure(allow_tcp_fallback=False)``."""
