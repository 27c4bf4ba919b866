"""Scattered transfers from Python: strided arrays and tensors as local
memory (moved as the ranges they form, with no contiguous copy), and
RDMAAction's explicit ranges, against owners in other processes (the
same-host transport, and tcp)."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest
import torch
from conftest import Owner
from peers import NP_SIZE, pattern

import rdmabuf
from rdmabuf import RDMAAction

PATTERN = pattern(NP_SIZE)


@pytest.fixture(params=["same-host", "tcp"])
def np_owner(request: Any, owner: Owner, tcp_owner: Owner) -> Iterator[Owner]:
    """An owner process whose "np" buffer holds PATTERN, over each transport."""
    yield owner if request.param == "same-host" else tcp_owner


# Local memory that is not contiguous: a base array or tensor, and a view of it.
STRIDED = [
    ("every other row", lambda: np.zeros((64, 96), dtype=np.uint8), lambda b: b[::2]),
    ("a column block", lambda: np.zeros((40, 100), dtype=np.uint8), lambda b: b[:, 10:70]),
    ("reversed rows", lambda: np.zeros((30, 50), dtype=np.uint16), lambda b: b[::-1, ::2]),
    ("a transposed tensor", lambda: torch.zeros(48, 32, dtype=torch.int32), lambda b: b.t()),
    ("every third float", lambda: torch.zeros(3000, dtype=torch.float32), lambda b: b[::3]),
    ("a 3-D slice", lambda: torch.zeros(6, 10, 12, dtype=torch.int16),
     lambda b: b[1:5, ::2, 3:9]),
]


def element_bytes(x: Any) -> bytes:
    """The bytes of x's elements in row-major order."""
    if isinstance(x, torch.Tensor):
        return x.contiguous().numpy().tobytes()
    return np.ascontiguousarray(x).tobytes()


def nbytes_of(x: Any) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else x.nbytes


def set_elements(view: Any, data: bytes) -> None:
    """view's elements, in row-major order, from `data`."""
    if isinstance(view, torch.Tensor):
        flat = torch.frombuffer(bytearray(data), dtype=view.dtype)
        view.copy_(flat.reshape(view.shape))
    else:
        view[...] = np.frombuffer(data, dtype=view.dtype).reshape(view.shape)


@pytest.mark.parametrize("what, make, view_of", STRIDED, ids=[c[0] for c in STRIDED])
def test_read_into_a_strided_destination_fills_its_elements(
    np_owner: Owner, what: str, make: Any, view_of: Any
) -> None:
    base = make()
    dst = view_of(base)
    nbytes = nbytes_of(dst)
    buf = np_owner.buffers["np"].slice(1000, nbytes)
    assert buf.read_into(dst).get() == nbytes
    expected = make()
    set_elements(view_of(expected), PATTERN[1000 : 1000 + nbytes].tobytes())
    # The view's elements hold the bytes; the rest of the base is untouched.
    assert element_bytes(base) == element_bytes(expected)


@pytest.mark.parametrize("what, make, view_of", STRIDED, ids=[c[0] for c in STRIDED])
def test_write_from_a_strided_source_sends_its_elements(
    owner: Owner, what: str, make: Any, view_of: Any
) -> None:
    base = make()
    src = view_of(base)
    nbytes = nbytes_of(src)
    set_elements(src, pattern(nbytes, seed=11).tobytes())
    buf = owner.buffers["np"]
    try:
        assert buf.slice(50_000, nbytes).write_from(src).get() == nbytes
        now = owner.call("bytes", "np")
        assert now[50_000 : 50_000 + nbytes] == element_bytes(src)
        assert now[: 50_000] == PATTERN[: 50_000].tobytes()
    finally:  # the pattern back, for the other tests of this owner
        RDMAAction().write_remote(buf, PATTERN).submit().get()


def test_action_reads_interleaved_views_of_one_matrix(np_owner: Owner) -> None:
    m = np.zeros((16, 64), dtype=np.uint8)
    buf = np_owner.buffers["np"]
    RDMAAction().read_remote(m[::2], buf.slice(0, 512)).read_remote(
        m[1::2], buf.slice(4096, 512)
    ).submit().get()
    assert (m[::2].reshape(-1) == PATTERN[:512]).all()
    assert (m[1::2].reshape(-1) == PATTERN[4096 : 4096 + 512]).all()


def test_explicit_ranges_read_pages_in_one_op(np_owner: Owner) -> None:
    pages = [(k * 8192, (31 - k) * 4096, 4096) for k in range(32)]  # every other page, reversed
    dst = bytearray(32 * 4096)
    RDMAAction().read_remote(dst, np_owner.buffers["np"], ranges=pages).submit().get()
    for remote, local, length in pages:
        assert dst[local : local + length] == PATTERN[remote : remote + length].tobytes()


def test_strided_and_ranged_writes_land_in_the_owner(owner: Owner) -> None:
    buf = owner.buffers["np"]
    try:
        src = (np.arange(20 * 30, dtype=np.int64).reshape(20, 30) % 251).astype(np.uint8)[:, ::-3]
        assert buf.slice(100_000, src.size).write_from(src).get() == src.size
        words = np.arange(64, dtype=np.uint64) * 0x0101010101010101
        RDMAAction().write_remote(
            buf, words, ranges=[(200_000, 0, 8), (300_000, 8 * 63, 8), (250_000, 80, 16)]
        ).submit().get()
        now = np.frombuffer(owner.call("bytes", "np"), dtype=np.uint8)
        assert now[100_000 : 100_000 + src.size].tobytes() == element_bytes(src)
        raw = words.tobytes()
        assert now[200_000:200_008].tobytes() == raw[0:8]
        assert now[300_000:300_008].tobytes() == raw[8 * 63 : 8 * 64]
        assert now[250_000:250_016].tobytes() == raw[80:96]
        assert (now[200_008:250_000] == PATTERN[200_008:250_000]).all()
    finally:  # the pattern back, for the other tests of this owner
        RDMAAction().write_remote(buf, PATTERN).submit().get()


def test_contiguous_arrays_of_any_shape_are_plain_ops(np_owner: Owner) -> None:
    dst = torch.zeros(8, 4, 16, dtype=torch.uint8)
    np_owner.buffers["np"].slice(0, 512).read_into(dst).get()
    assert element_bytes(dst) == PATTERN[:512].tobytes()


def test_bad_ranges_are_refused_before_anything_moves() -> None:
    data = np.zeros(4096, dtype=np.uint8)
    buf = rdmabuf.RDMABuffer(data)
    dst = bytearray(1024)
    action = RDMAAction()
    with pytest.raises(ValueError, match="ends past the buffer"):
        action.read_remote(dst, buf, ranges=[(4000, 0, 100)])
    with pytest.raises(ValueError, match="ends past the local"):
        action.read_remote(dst, buf, ranges=[(0, 1000, 100)])
    with pytest.raises(ValueError, match="empty"):
        action.read_remote(dst, buf, ranges=[(0, 0, 0)])
    with pytest.raises(ValueError, match="empty"):
        action.read_remote(dst, buf, ranges=[])
    with pytest.raises(TypeError, match="triple"):
        action.read_remote(dst, buf, ranges=[(0, 1)])
    assert len(action) == 0
    # Overlapping destinations are refused by the manager, at submit.
    action.read_remote(dst, buf, ranges=[(0, 0, 100), (200, 50, 10)])
    with pytest.raises(rdmabuf.InvalidArgumentError, match="overlap in local memory"):
        action.submit().get()
    # A broadcast view's elements share memory: reading into it is refused.
    with pytest.raises(rdmabuf.InvalidArgumentError, match="overlap in local memory"):
        buf.slice(0, 8).read_into(torch.zeros(1, dtype=torch.uint8).expand(8)).get()
    # Explicit ranges take contiguous local memory: not a strided view,
    # even one that covers its memory exactly (reversed, transposed).
    for view in (np.zeros((8, 8), np.uint8)[::2], np.zeros(64, np.uint8)[::-1],
                 torch.zeros(8, 8, dtype=torch.uint8).t()):
        with pytest.raises(rdmabuf.InvalidArgumentError, match="not contiguous"):
            RDMAAction().read_remote(view, buf, ranges=[(0, 0, 8)]).submit()
    assert bytes(dst) == bytes(1024)
    buf.drop()


def test_too_many_pieces_is_a_value_error() -> None:
    buf = rdmabuf.RDMABuffer(np.zeros(8 << 20, dtype=np.uint8))
    every_other_byte = np.zeros(2 * ((1 << 20) + 1), dtype=np.uint8)[::2]
    with pytest.raises(ValueError, match="separate pieces"):
        buf.slice(0, every_other_byte.size).read_into(every_other_byte)
    buf.drop()
