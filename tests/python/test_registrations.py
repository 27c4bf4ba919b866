"""Registrations of Python memory over a real NIC: transfers on one array
reuse one registration while its storage lives, objects without a storage
identity are registered per transfer, and memory unmapped and mapped again
at the same address is read into correctly.

Needs a viable ibverbs backend: tests/softroce/run_ibverbs_tests.sh runs
this file inside the Soft-RoCE VM (RDMABUF_BACKENDS=ibverbs); elsewhere it
is skipped, saying why."""

from __future__ import annotations

import gc
import mmap
import os
from typing import Iterator

import needs
import pytest

np = needs.module("numpy")

import rdmabuf
from rdmabuf import _manager

SIZE = 64 << 10


def _ibverbs_unviable() -> str:
    for b in rdmabuf.backends():
        if b.name == "ibverbs":
            return "" if b.viable else b.reason
    return "rdmabuf lists no ibverbs backend"


_why_not = (
    "needs RDMABUF_BACKENDS=ibverbs" if rdmabuf.config().backends != ("ibverbs",)
    else _ibverbs_unviable()
)
if _why_not and "ibverbs" in os.environ.get("RDMABUF_TEST_REQUIRE_BACKENDS", ""):
    raise RuntimeError(f"RDMABUF_TEST_REQUIRE_BACKENDS names ibverbs, but: {_why_not}")
pytestmark = pytest.mark.skipif(
    bool(_why_not), reason=f"{_why_not} (the Soft-RoCE VM runs these: ibverbs_in_softroce_vm)"
)


def made() -> int:
    for name, _level, _viable, _reason, details in _manager.default_manager().backends():
        if name == "ibverbs":
            return int(dict(details)["local registrations made"])
    raise AssertionError("no ibverbs backend")


def pattern(seed: int) -> "np.ndarray":
    return ((np.arange(SIZE, dtype=np.int64) * 13 + seed) % 251).astype(np.uint8)


@pytest.fixture()
def remote() -> Iterator["rdmabuf.RDMABuffer"]:
    data = pattern(1)
    buf = rdmabuf.RDMABuffer(data)  # keeps `data` alive until dropped
    assert buf.backend == "ibverbs"
    yield buf
    buf.drop()


def test_reads_into_one_array_make_one_registration(remote: "rdmabuf.RDMABuffer") -> None:
    dst = np.zeros(2 * SIZE, dtype=np.uint8)
    before = made()
    for i in range(100):
        remote.read_into(dst[i : i + SIZE]).get()  # views of one array
        assert np.array_equal(dst[i : i + SIZE], pattern(1))
    assert made() - before == 1


def test_bytearrays_are_registered_per_read(remote: "rdmabuf.RDMABuffer") -> None:
    dst = bytearray(SIZE)
    before = made()
    for _ in range(5):
        remote.read_into(dst).get()
    assert made() - before == 5
    assert bytes(dst) == pattern(1).tobytes()


def test_memory_mapped_again_at_the_same_address_is_read_correctly(
    remote: "rdmabuf.RDMABuffer",
) -> None:
    first = mmap.mmap(-1, 4 * SIZE)
    array = np.frombuffer(first, dtype=np.uint8)
    address = array.ctypes.data
    remote.read_into(array).get()
    assert np.array_equal(array[:SIZE], pattern(1))
    del array
    gc.collect()
    first.close()

    second = mmap.mmap(-1, 4 * SIZE)
    array = np.frombuffer(second, dtype=np.uint8)
    if array.ctypes.data != address:
        pytest.skip("the kernel did not map the same address again")
    array[:] = 0xEE
    rdmabuf.RDMABuffer.from_bytes(remote.to_bytes()).write_from(pattern(2)).get()
    remote.read_into(array).get()
    assert np.array_equal(array[:SIZE], pattern(2)), "the read landed in the old pages"
    del array
    gc.collect()
    second.close()
