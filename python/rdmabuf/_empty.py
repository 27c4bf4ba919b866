"""rdmabuf.empty: a tensor or array in memory that same-host peers copy at memory speed."""

from __future__ import annotations

import operator
import sys
from typing import TYPE_CHECKING, Any, Iterable, Tuple, Union

from . import _rdmabuf
from ._errors import InvalidArgumentError, ResourceExhaustedError

if TYPE_CHECKING:
    import numpy
    import torch

    Shape = Union[int, Iterable[int]]
    DType = Union[None, str, type, numpy.dtype, torch.dtype]
else:
    Shape = Any
    DType = Any

__all__ = ["empty"]


def empty(shape: Shape, dtype: DType = None) -> Any:
    """A new torch tensor or numpy array of `shape`, in memory rdmabuf allocates.

    For a torch.dtype, a CPU torch.Tensor; for any other `dtype` numpy
    understands ("float32", numpy.float32, ...; default numpy.uint8), a
    numpy.ndarray. `shape` is an int or a tuple of ints, as for numpy.empty.
    Torch is never imported here: a torch.dtype exists only once it is.

    The memory lies in a shared file of its own (a memfd), so that once it
    is registered (``RDMABuffer(t.view(-1))``, ``RDMABuffer(a.reshape(-1))``),
    readers and writers on this host map the file and copy with plain loads
    and stores, at memory speed, instead of through a system call per
    transfer. It is zero-filled (unlike numpy.empty's and torch.empty's) and
    page-aligned, lives as long as the returned tensor or array or any view
    of it, and, like any MAP_SHARED memory, stays shared with a child after
    fork() rather than copied on write. Memory already in a shared file (a
    tensor after share_memory_(), an array over a /dev/shm file or a memfd)
    is reached the same way.

    Monarch has no such function; it is an rdmabuf addition. A shape with no
    elements, a negative dimension or a dtype that holds Python objects is a
    ValueError (InvalidArgumentError); memory that cannot be had is a
    ResourceExhaustedError.
    """
    dims = _dims(shape)
    count = 1
    for d in dims:
        count *= d
    torch = sys.modules.get("torch")  # a torch.dtype exists only once torch is imported
    if torch is not None and isinstance(dtype, torch.dtype):
        itemsize = torch.empty((), dtype=dtype).element_size()
        memory = _allocate(dims, count * itemsize)
        return torch.frombuffer(memory, dtype=dtype).view(dims)

    import numpy

    dt = numpy.dtype(numpy.uint8 if dtype is None else dtype)
    if dt.hasobject:
        raise InvalidArgumentError(
            f"rdmabuf.empty: dtype {dt} holds Python objects; rdmabuf's memory holds plain data"
        )
    memory = _allocate(dims, count * dt.itemsize)
    return numpy.frombuffer(memory, dtype=dt).reshape(dims)


def _dims(shape: Shape) -> Tuple[int, ...]:
    try:
        dims = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(
                f"rdmabuf.empty: shape must be an int or a tuple of ints, not {shape!r}"
            ) from None
    if any(d < 0 for d in dims):
        raise InvalidArgumentError(f"rdmabuf.empty: negative dimension in shape {dims}")
    return dims


def _allocate(dims: Tuple[int, ...], nbytes: int) -> _rdmabuf.Allocation:
    if nbytes == 0:
        raise InvalidArgumentError(
            f"rdmabuf.empty: shape {dims} holds 0 bytes; rdmabuf cannot allocate empty memory"
        )
    if nbytes > sys.maxsize:
        raise ResourceExhaustedError(f"rdmabuf.empty: shape {dims} needs {nbytes} B, too many")
    return _rdmabuf.allocate(nbytes)
