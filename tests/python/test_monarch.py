"""Monarch's public API (``monarch.rdma`` after its PR #4078), run as Monarch
code spells it: RDMABuffer, RDMAAction.read_remote / write_remote / submit,
get_rdma_backend, is_ibverbs_available, is_rdma_available,
RDMATcpFallbackWarning, the 60 s default timeout, and the older rdmabuf
spellings that still work with a DeprecationWarning. Also the identities
that let transfers on one tensor or array reuse one registration."""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import subprocess
import sys
import warnings
from typing import Any

import needs
import pytest

np = needs.module("numpy")
torch = needs.module("torch")

import rdmabuf
from rdmabuf import (
    InvalidArgumentError,
    RDMAAction,
    RDMABuffer,
    RDMATcpFallbackWarning,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)
from rdmabuf import _rdmabuf


def test_a_monarch_program_runs_unchanged() -> None:
    # What a Monarch user writes: tensors in, futures out, awaited or got.
    weights = torch.arange(1024, dtype=torch.float32)
    buffer = RDMABuffer(weights.view(torch.uint8).flatten())
    assert buffer.size() == weights.numel() * 4
    assert buffer.backend in ("memory", "tcp")
    assert buffer.owner.pid == os.getpid()

    local = torch.zeros(1024, dtype=torch.float32)
    buffer.read_into(local.view(torch.uint8).flatten(), timeout=10).get()
    assert torch.equal(local, weights)

    async def write_back() -> None:
        await buffer.write_from(torch.full((1024,), 2.0).view(torch.uint8).flatten())

    asyncio.run(write_back())
    assert bool((weights == 2.0).all())

    # A batch, submitted twice: each submit runs the same ops again.
    other = torch.zeros(256, dtype=torch.uint8)
    other_buffer = RDMABuffer(other)
    dst = torch.zeros(weights.numel() * 4, dtype=torch.uint8)
    src = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    action = RDMAAction().read_remote(dst, buffer).write_remote(other_buffer, src)
    action.submit(timeout=10).get()
    assert torch.equal(dst.view(torch.float32), weights)
    assert torch.equal(other, src)
    weights.fill_(5.0)
    other.zero_()
    asyncio.run(_awaited(action.submit()))
    assert bool((dst.view(torch.float32) == 5.0).all())
    assert torch.equal(other, src)

    buffer.drop()
    other_buffer.drop()
    with pytest.raises(rdmabuf.NotFoundError):
        buffer.read_into(local.view(torch.uint8).flatten()).get()


async def _awaited(future: Any) -> Any:
    return await future


def test_empty_or_non_contiguous_data_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        RDMABuffer(torch.zeros(0, dtype=torch.uint8))
    with pytest.raises(ValueError):
        RDMABuffer(torch.zeros(8, 8, dtype=torch.uint8)[:, 0])
    with pytest.raises(ValueError):
        RDMABuffer(np.zeros((4, 4), dtype=np.uint8)[:, 1])


def test_timeouts_default_to_60_seconds() -> None:
    for method in (RDMABuffer.read_into, RDMABuffer.write_from, RDMAAction.submit):
        assert inspect.signature(method).parameters["timeout"].default == 60
    assert rdmabuf.DEFAULT_TIMEOUT == 60


def test_backend_queries() -> None:
    backend = get_rdma_backend()
    assert backend in ("ibverbs", "tcp", "none")
    assert is_ibverbs_available() == (backend == "ibverbs")
    assert is_rdma_available() == (backend != "none")
    viable = {b.name for b in rdmabuf.backends() if b.viable}
    assert backend == ("ibverbs" if "ibverbs" in viable else "tcp")


def test_backend_queries_without_tcp_fallback() -> None:
    # In a fresh process, so that this one's manager keeps its configuration.
    code = (
        "import rdmabuf; rdmabuf.configure(allow_tcp_fallback=False, backends='memory,tcp'); "
        "print(rdmabuf.get_rdma_backend(), rdmabuf.is_rdma_available(), "
        "rdmabuf.is_ibverbs_available())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["none", "False", "False"]


def test_tcp_fallback_warns_when_a_buffer_is_made() -> None:
    if is_ibverbs_available():
        pytest.skip("an RDMA device is usable here, so nothing falls back to TCP")
    with pytest.warns(RDMATcpFallbackWarning, match="over TCP"):
        buf = RDMABuffer(np.zeros(16, dtype=np.uint8))
    assert issubclass(RDMATcpFallbackWarning, Warning)
    buf.drop()


def test_tcp_fallback_warns_on_the_first_transfer_to_an_owner_reached_over_tcp(
    tcp_owner: Any,
) -> None:
    handle = RDMABuffer.from_bytes(tcp_owner.buffers["np"].to_bytes())
    assert handle.backend == "tcp"
    dst = np.zeros(handle.size(), dtype=np.uint8)
    rdmabuf._buffer._tcp_owners_warned.discard(handle.owner.manager_id)
    with pytest.warns(RDMATcpFallbackWarning, match="reached over TCP"):
        handle.read_into(dst).get()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per owner
        handle.read_into(dst).get()
        RDMABuffer.from_bytes(handle.to_bytes()).read_into(dst).get()


def test_arguments_in_the_wrong_order_are_a_type_error() -> None:
    buf = RDMABuffer(np.zeros(16, dtype=np.uint8))
    local = np.zeros(16, dtype=np.uint8)
    with pytest.raises(TypeError, match="read_remote: src must be an RDMABuffer"):
        RDMAAction().read_remote(buf, local)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="write_remote: dst must be an RDMABuffer"):
        RDMAAction().write_remote(local, buf)  # type: ignore[arg-type]
    buf.drop()


def test_fetch_add_and_compare_and_swap_with_monarchs_signatures() -> None:
    data = np.zeros(4, dtype=np.uint64)
    buf = RDMABuffer(data)
    word = buf.slice(8, 8)
    out = np.full(1, 77, dtype=np.uint64)
    RDMAAction().fetch_add(word, out, 5).submit().get()
    assert (out[0], data[1]) == (0, 5)
    RDMAAction().fetch_add(word, out, -2).submit().get()  # wraps: subtracts
    assert (out[0], data[1]) == (5, 3)
    RDMAAction().compare_and_swap(word, out, 7, 10).submit().get()  # no match
    assert (out[0], data[1]) == (3, 3)
    previous = torch.zeros(1, dtype=torch.int64)  # a tensor as dst
    RDMAAction().compare_and_swap(word, previous, 3, 2**64 - 1).submit().get()
    assert int(previous[0]) == 3 and data[1] == 2**64 - 1
    # A batch of adds on one word, and reads beside them: each add sees the one before.
    outs = np.zeros(8, dtype=np.uint64)
    action = RDMAAction()
    for i in range(8):
        action.fetch_add(buf.slice(16, 8), outs[i:i + 1], 1)
    action.submit().get()
    assert sorted(outs.tolist()) == list(range(8)) and data[2] == 8
    assert data[0] == 0 and data[3] == 0  # the neighbours untouched
    buf.drop()
    # In shared memory, which a same-host reader maps: applied by its own CPU.
    shared = torch.zeros(4, dtype=torch.int64).share_memory_()
    sbuf = RDMABuffer(shared)
    RDMAAction().fetch_add(sbuf.slice(24, 8), out, 7).fetch_add(sbuf.slice(0, 8), outs[:1], -1) \
        .submit().get()
    assert shared.tolist() == [-1, 0, 0, 7] and out[0] == 0 and outs[0] == 0
    sbuf.drop()


def test_atomics_refuse_what_is_not_one_aligned_word() -> None:
    data = np.zeros(4, dtype=np.uint64)
    buf = RDMABuffer(data)
    out = np.zeros(1, dtype=np.uint64)
    with pytest.raises(InvalidArgumentError, match="one 8-byte word"):
        RDMAAction().fetch_add(buf, out, 1)
    with pytest.raises(InvalidArgumentError, match="less than the word's 8 B"):
        RDMAAction().fetch_add(buf.slice(0, 8), np.zeros(4, dtype=np.uint8), 1)
    with pytest.raises(InvalidArgumentError, match="does not fit in a 64-bit word"):
        RDMAAction().compare_and_swap(buf.slice(0, 8), out, 2**64, 1)
    with pytest.raises(TypeError, match="compare_and_swap: src must be an RDMABuffer"):
        RDMAAction().compare_and_swap(out, buf, 0, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="not 8-byte aligned"):
        RDMAAction().fetch_add(buf.slice(4, 8), out, 1).submit().get()
    with pytest.raises(ValueError, match="overlaps"):  # two previous values into one place
        RDMAAction().fetch_add(buf.slice(0, 8), out, 1).fetch_add(buf.slice(8, 8), out, 1).submit()
    assert not data.any()
    buf.drop()


def test_older_spellings_work_and_warn() -> None:
    data = np.arange(32, dtype=np.uint8)
    buf = RDMABuffer(data)
    out = np.zeros(32, dtype=np.uint8)
    with pytest.warns(DeprecationWarning, match="read_remote"):
        action = RDMAAction().read_into(buf, out)
    with pytest.warns(DeprecationWarning, match="write_remote"):
        action.write_from(buf, np.full(8, 9, dtype=np.uint8))
    assert len(action) == 2
    action.submit().get()
    assert np.array_equal(out, np.arange(32, dtype=np.uint8))
    assert (data[:8] == 9).all()
    buf.drop()


# --- One registration per storage ----------------------------------------------


def test_transfers_on_one_array_share_one_identity() -> None:
    buf = RDMABuffer(np.arange(4096, dtype=np.uint8))
    before = _rdmabuf.storage_identity_count()
    dst = np.zeros(8192, dtype=np.uint8)
    for i in range(10):
        buf.read_into(dst[i : i + 4096]).get()  # a new view each time
        buf.write_from(memoryview(dst)[i : i + 16]).get()
    assert _rdmabuf.storage_identity_count() == before + 1
    t = torch.zeros(16384, dtype=torch.uint8)
    for i in range(10):
        buf.read_into(t[i : i + 4096]).get()  # a new view each time
    assert _rdmabuf.storage_identity_count() == before + 2
    del dst, t
    gc.collect()
    assert _rdmabuf.storage_identity_count() == before, "dropped with their storage"
    # Objects whose life cannot be watched get none (registered per transfer).
    buf.read_into(bytearray(4096)).get()
    assert _rdmabuf.storage_identity_count() == before
    buf.drop()
