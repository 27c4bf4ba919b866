"""rdmabuf.empty (tensors and arrays in memory of rdmabuf's own, in a shared
file), and transfers from another process on memory in a shared file:
rdmabuf.empty's, a torch tensor after share_memory_(), a memfd the test maps
itself. The reader maps such a file and copies with loads and stores; it
says whether it mapped it."""

from __future__ import annotations

import fcntl
import gc
import mmap
import os
import subprocess
import sys
import weakref
from typing import Any, Callable, Iterator, Optional, Tuple

import needs
import pytest

np = needs.module("numpy")
torch = needs.module("torch")

import peers
from conftest import PeerProcess
import rdmabuf
from rdmabuf import _rdmabuf

PAGE = mmap.PAGESIZE


def address(data: Any) -> int:
    return data.data_ptr() if isinstance(data, torch.Tensor) else data.ctypes.data


def mapping(addr: int) -> Optional[Tuple[str, ...]]:
    """The fields of the /proc/self/maps line that holds `addr`: range,
    permissions, offset, device, inode, path; None when it is not mapped."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= addr < end:
                return tuple(f.strip() for f in fields)
    return None


def in_own_memfd(addr: int) -> bool:
    """Whether `addr` lies in a shared mapping of a memfd (rdmabuf.empty's memory)."""
    m = mapping(addr)
    return m is not None and m[1][3] == "s" and len(m) > 5 and m[5].startswith("/memfd:")


# --- Shapes, dtypes, contents -----------------------------------------------------


@pytest.mark.parametrize(
    "shape, dtype, want_shape, want_dtype",
    [
        (10, None, (10,), np.uint8),
        ((3, 4), "float32", (3, 4), np.float32),
        ([2, 3, 4], np.int64, (2, 3, 4), np.int64),
        (np.int32(5), np.dtype("complex64"), (5,), np.complex64),
        ((), "float64", (), np.float64),
        ((1 << 20) + 3, "uint8", ((1 << 20) + 3,), np.uint8),
    ],
    ids=["int", "str-dtype", "list-shape", "numpy-int", "0-d", "odd-size"],
)
def test_numpy_array(shape: Any, dtype: Any, want_shape: Tuple[int, ...], want_dtype: Any) -> None:
    a = rdmabuf.empty(shape, dtype)
    assert isinstance(a, np.ndarray)
    assert a.shape == want_shape and a.dtype == want_dtype
    assert a.flags.c_contiguous and a.flags.writeable
    assert not a.any(), "not zero-filled"
    assert address(a) % PAGE == 0
    assert in_own_memfd(address(a)), mapping(address(a))
    a[...] = 7
    assert (a == 7).all()


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((4, 5), torch.float32),
        (7, torch.uint8),
        ((2, 2, 2), torch.int64),
        (3, torch.bfloat16),
        ((4,), torch.bool),
        ((2, 3), torch.complex64),
        ((), torch.float16),
    ],
    ids=["f32", "u8-int-shape", "i64", "bf16", "bool", "c64", "0-d"],
)
def test_torch_tensor(shape: Any, dtype: Any) -> None:
    t = rdmabuf.empty(shape, dtype)
    assert isinstance(t, torch.Tensor)
    assert t.shape == torch.Size((shape,) if isinstance(shape, int) else shape)
    assert t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()
    assert bool((t == 0).all()), "not zero-filled"
    assert address(t) % PAGE == 0
    assert in_own_memfd(address(t)), mapping(address(t))
    t.fill_(1)
    assert bool(t.all())


def test_torch_is_imported_only_for_a_torch_dtype() -> None:
    code = (
        "import sys, rdmabuf\n"
        "a = rdmabuf.empty((2, 3), 'float32')\n"
        "assert a.shape == (2, 3) and not a.any()\n"
        "assert 'torch' not in sys.modules, 'rdmabuf.empty imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    "shape, dtype, error, match",
    [
        (0, None, ValueError, "0 bytes"),
        ((3, 0), "float32", ValueError, "0 bytes"),
        ((0,), torch.float32, ValueError, "0 bytes"),
        (-1, None, ValueError, "negative"),
        ((2, -3), torch.float32, ValueError, "negative"),
        ("12", None, TypeError, "shape"),
        (2.5, None, TypeError, "shape"),
        ((1 << 40, 1 << 40), None, rdmabuf.ResourceExhaustedError, "too many"),
        (4, object, ValueError, "Python objects"),
        (4, "no such dtype", TypeError, ""),
    ],
    ids=["zero", "zero-dim", "zero-torch", "negative", "negative-torch", "str-shape",
         "float-shape", "huge", "object-dtype", "bad-dtype"],
)
def test_errors(shape: Any, dtype: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match) as e:
        rdmabuf.empty(shape, dtype)
    if error is ValueError:
        assert isinstance(e.value, rdmabuf.InvalidArgumentError)


# --- Lifetime ----------------------------------------------------------------------


def holder(a: Any) -> Any:
    """The _rdmabuf.Allocation at the bottom of a numpy array's chain of bases."""
    while a is not None and not isinstance(a, _rdmabuf.Allocation):
        a = getattr(a, "base", None) if not isinstance(a, memoryview) else a.obj
    assert a is not None, "no Allocation below the array"
    return a


def test_numpy_memory_lives_as_long_as_a_view() -> None:
    a = rdmabuf.empty((64, 1024), "float32")
    a[3] = 2.5
    owner = weakref.ref(holder(a))
    row = a[3]
    addr = address(a)
    del a
    gc.collect()
    assert owner() is not None and in_own_memfd(addr)
    assert (row == 2.5).all()
    row[:] = 4.0
    assert (row == 4.0).all()
    del row
    gc.collect()
    assert owner() is None, "the allocation outlived every view of it"
    assert not in_own_memfd(addr), f"still mapped: {mapping(addr)}"


def test_torch_memory_lives_as_long_as_a_view() -> None:
    t = rdmabuf.empty((64, 1024), torch.float32)
    t[5] = 1.5
    row = t[5]
    addr = address(t)
    del t
    gc.collect()
    assert in_own_memfd(addr)
    assert bool((row == 1.5).all())
    row.fill_(3.0)
    assert bool((row == 3.0).all())
    del row
    gc.collect()
    assert not in_own_memfd(addr), f"still mapped: {mapping(addr)}"


def test_registered_memory_outlives_the_array() -> None:
    a = rdmabuf.empty(1 << 16)
    a[:] = peers.pattern(1 << 16)
    buf = rdmabuf.RDMABuffer(a)
    addr = address(a)
    del a
    gc.collect()
    dst = np.zeros(1 << 16, dtype=np.uint8)
    assert buf.read_into(dst).get() == 1 << 16
    assert np.array_equal(dst, peers.pattern(1 << 16))
    buf.drop()
    gc.collect()
    assert not in_own_memfd(addr), f"still mapped: {mapping(addr)}"


def test_shared_with_a_forked_child() -> None:
    a = rdmabuf.empty(PAGE * 2)
    pid = os.fork()
    if pid == 0:  # the child: writes, and leaves without running any cleanup
        a[:] = 9
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (a == 9).all(), "the child's writes did not reach the parent"


# --- Transfers from another process on memory in a shared file ---------------------


class Reader(PeerProcess):
    """A spawned process that reads and writes the test's buffers (peers.maps_file_main)."""

    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=peers.maps_file_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()


@pytest.fixture(scope="module")
def reader(spawn: Any) -> Iterator[Reader]:
    r = Reader(spawn)
    yield r
    r.close()


SIZE = 1 << 20


def empty_numpy() -> Iterator[Any]:
    yield rdmabuf.empty(SIZE)


def empty_torch() -> Iterator[Any]:
    yield rdmabuf.empty((SIZE // 4096, 1024), torch.float32).view(-1)


def shared_tensor() -> Iterator[Any]:
    yield torch.zeros(SIZE // 4, dtype=torch.float32).share_memory_()


def memfd(sealed: bool) -> Iterator[Any]:
    fd = os.memfd_create("rdmabuf-test", os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if sealed else 0))
    try:
        os.ftruncate(fd, SIZE)
        if sealed:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        m = mmap.mmap(fd, SIZE)  # MAP_SHARED, read and write
        a = np.frombuffer(m, dtype=np.uint8)
        try:
            yield a
        finally:
            del a  # the last export of `m`: the caller let go of its references
            m.close()
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "make",
    [empty_numpy, empty_torch, shared_tensor, lambda: memfd(False), lambda: memfd(True)],
    ids=["empty-numpy", "empty-torch", "share_memory_", "memfd", "memfd-sealed"],
)
def test_peer_maps_the_file_to_read_and_write(reader: Reader, make: Callable[[], Any]) -> None:
    memory = make()
    data = next(memory)
    view = data.view(torch.uint8) if isinstance(data, torch.Tensor) else data
    raw = view.numpy() if isinstance(view, torch.Tensor) else view
    m = mapping(address(data))
    assert m is not None and m[1][3] == "s", f"not in a shared mapping: {m}"
    file = (m[3], m[4])
    buf = rdmabuf.RDMABuffer(view)
    try:
        raw[:] = peers.pattern(SIZE, seed=5)

        got, mapped = reader.call("read", buf, file)
        assert got == peers.pattern(SIZE, seed=5).tobytes()
        assert mapped, f"the reader did not map the owner's file {m}"

        # A slice at an offset that is not page-aligned, both ways.
        part = buf.slice(PAGE + 123, 3 * PAGE)
        got, _ = reader.call("read", part, file)
        assert got == raw[PAGE + 123 : 4 * PAGE + 123].tobytes()
        src = peers.pattern(3 * PAGE, seed=17).tobytes()
        assert reader.call("write", part, src) == len(src)
        expected = peers.pattern(SIZE, seed=5)
        expected[PAGE + 123 : 4 * PAGE + 123] = peers.pattern(3 * PAGE, seed=17)
        assert raw.tobytes() == expected.tobytes()

        # The whole buffer, written by the peer.
        src = peers.pattern(SIZE, seed=29).tobytes()
        assert reader.call("write", buf, src) == SIZE
        assert raw.tobytes() == src
    finally:
        buf.drop()
        del view, raw, data
        memory.close()
