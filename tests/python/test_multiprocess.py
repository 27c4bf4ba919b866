"""Transfers between processes started with multiprocessing (spawn)."""

from __future__ import annotations

import asyncio
import pickle
import time
from typing import Any

import needs
import pytest

np = needs.module("numpy")
torch = needs.module("torch")

import peers
import rdmabuf
from conftest import Owner


def test_read_numpy_and_torch_from_owner_process(owner: Owner) -> None:
    np_buf = owner.buffers["np"]
    t_buf = owner.buffers["torch"]
    assert not np_buf.is_owner
    assert np_buf.size() == peers.NP_SIZE
    assert t_buf.size() == peers.TORCH_NUMEL * 4
    assert np_buf.owner.pid == owner.proc.pid
    assert "tcp" in np_buf.backends

    dst = np.zeros(peers.NP_SIZE, dtype=np.uint8)
    assert np_buf.read_into(dst).get() == peers.NP_SIZE
    assert np.array_equal(dst, peers.pattern(peers.NP_SIZE))

    t = torch.empty(peers.TORCH_NUMEL, dtype=torch.float32)
    assert t_buf.read_into(t).get() == t_buf.size()
    assert torch.equal(t, torch.arange(peers.TORCH_NUMEL, dtype=torch.float32))

    # Into the front of a larger destination, the rest untouched.
    big = torch.full((peers.TORCH_NUMEL + 8,), -1.0)
    t_buf.read_into(big).get()
    assert torch.equal(big[: peers.TORCH_NUMEL], t)
    assert bool((big[peers.TORCH_NUMEL :] == -1.0).all())


def test_write_numpy_and_torch_into_owner_process(owner: Owner) -> None:
    np_buf = owner.buffers["np"]
    t_buf = owner.buffers["torch"]
    try:
        # A torch tensor into the owner's numpy array; a smaller numpy array
        # into the front of the owner's tensor.
        src = torch.from_numpy(peers.pattern(peers.NP_SIZE, seed=100))
        assert np_buf.write_from(src).get() == peers.NP_SIZE
        assert owner.call("bytes", "np") == src.numpy().tobytes()

        half = np.full(peers.TORCH_NUMEL // 2, 7.0, dtype=np.float32)
        assert t_buf.write_from(half).get() == half.nbytes
        expected = torch.arange(peers.TORCH_NUMEL, dtype=torch.float32)
        expected[: peers.TORCH_NUMEL // 2] = 7.0
        assert owner.call("bytes", "torch") == expected.numpy().tobytes()
    finally:
        np_buf.write_from(peers.pattern(peers.NP_SIZE)).get()
        t_buf.write_from(torch.arange(peers.TORCH_NUMEL, dtype=torch.float32)).get()


def test_spawned_reader_reads_and_writes_our_buffers(spawn: Any) -> None:
    array = peers.pattern(1 << 18, seed=5)
    tensor = torch.linspace(0, 1, 4096)
    original = tensor.clone()
    handles = {"np": rdmabuf.RDMABuffer(array), "torch": rdmabuf.RDMABuffer(tensor)}
    conn, child = spawn.Pipe()
    proc = spawn.Process(target=peers.reader_main, args=(handles, child), daemon=True)
    proc.start()
    child.close()
    try:
        assert conn.poll(60), "the reader process did not answer"
        out = conn.recv()
        if isinstance(out, Exception):
            raise out
    finally:
        proc.join(30)
    assert out["pid"] == proc.pid
    assert out["np_read"] == array.nbytes
    assert out["np_bytes"] == peers.pattern(1 << 18, seed=5).tobytes()
    assert out["torch_read"] == original.numel() * 4
    assert out["torch_bytes"] == original.numpy().tobytes()
    assert out["small_dst"] == "InvalidArgumentError"
    # What the reader wrote landed in our memory.
    assert out["np_written"] == array.nbytes
    assert np.array_equal(array, peers.pattern(1 << 18, seed=11))
    assert bool((tensor == 2.5).all())
    for h in handles.values():
        h.drop()


def test_processes_adding_to_one_remote_counter_see_every_value_once(spawn: Any) -> None:
    counters = np.zeros(2, dtype=np.uint64)
    buf = rdmabuf.RDMABuffer(counters)
    processes, count = 4, 500
    pipes, procs = [], []
    for _ in range(processes):
        conn, child = spawn.Pipe()
        proc = spawn.Process(target=peers.adder_main, args=(buf.slice(8, 8), count, child),
                             daemon=True)
        proc.start()
        child.close()
        pipes.append(conn)
        procs.append(proc)
    seen = []
    try:
        for conn in pipes:
            assert conn.poll(120), "an adder process did not answer"
            out = conn.recv()
            if isinstance(out, Exception):
                raise out
            seen += out
    finally:
        for proc in procs:
            proc.join(30)
    assert counters[1] == processes * count
    assert sorted(seen) == list(range(processes * count))
    assert counters[0] == 0
    buf.drop()


def test_many_concurrent_reads_with_gather(owner: Owner) -> None:
    np_buf = owner.buffers["np"]
    piece = 4096
    count = 256
    dst = np.zeros(piece * count, dtype=np.uint8)
    slices = [np_buf.slice(i * piece, piece) for i in range(count)]

    async def main() -> list:
        # Interleave reads into numpy views and into torch tensors.
        futures = []
        tensors = []
        for i, s in enumerate(slices):
            if i % 2:
                t = torch.zeros(piece, dtype=torch.uint8)
                tensors.append((i, t))
                futures.append(s.read_into(t))
            else:
                futures.append(s.read_into(dst[i * piece : (i + 1) * piece]))
        results = await asyncio.gather(*futures)
        for i, t in tensors:
            dst[i * piece : (i + 1) * piece] = t.numpy()
        return results

    results = asyncio.run(main())
    assert results == [piece] * count
    assert np.array_equal(dst, peers.pattern(peers.NP_SIZE)[: piece * count])


def test_gather_many_owners_and_directions(owner: Owner) -> None:
    """Reads from the other process and writes into our own buffer, together."""
    local = np.zeros(1 << 16, dtype=np.uint8)
    mine = rdmabuf.RDMABuffer(local)

    async def main() -> None:
        reads = [
            owner.buffers["np"].slice(i * 1024, 1024).read_into(np.zeros(1024, dtype=np.uint8))
            for i in range(32)
        ]
        writes = [
            mine.slice(i * 2048, 2048).write_from(np.full(2048, i, dtype=np.uint8))
            for i in range(32)
        ]
        await asyncio.gather(*reads, *writes)

    asyncio.run(main())
    assert all(bool((local[i * 2048 : (i + 1) * 2048] == i).all()) for i in range(32))
    mine.drop()


def test_pickled_handle_crosses_processes_as_bytes(owner: Owner) -> None:
    buf = owner.buffers["np"]
    data = pickle.dumps(buf)
    # The pickle holds the handle's bytes and a reference to the rebuild
    # function, nothing else.
    assert buf.to_bytes() in data
    again = pickle.loads(data)
    assert again.to_bytes() == buf.to_bytes()
    dst = bytearray(buf.size())
    again.read_into(dst).get()
    assert bytes(dst) == peers.pattern(peers.NP_SIZE).tobytes()


def test_timeout_when_owner_stops_answering(tcp_owner: Owner) -> None:
    buf = tcp_owner.buffers["np"].slice(0, 64)
    dst = np.zeros(64, dtype=np.uint8)
    with tcp_owner.stopped():
        start = time.monotonic()
        with pytest.raises(rdmabuf.DeadlineExceededError) as info:
            buf.read_into(dst, timeout=0.3).get()
        elapsed = time.monotonic() - start
        assert isinstance(info.value, TimeoutError)
        assert info.value.code == rdmabuf.StatusCode.DEADLINE_EXCEEDED
        assert info.value.retryable

        async def awaited() -> None:
            await buf.read_into(dst, timeout=0.3)

        with pytest.raises(TimeoutError):
            asyncio.run(awaited())
    assert 0.25 < elapsed < 10
    # The owner is back: the next read recovers.
    assert buf.read_into(dst, timeout=30).get() == 64
    assert np.array_equal(dst, peers.pattern(64))


def test_drop_in_owner_then_read_fails(owner: Owner) -> None:
    buf = owner.buffers["torch"]
    t = torch.zeros(peers.TORCH_NUMEL)
    buf.read_into(t).get()
    owner.call("drop", "torch")
    with pytest.raises(rdmabuf.NotFoundError) as info:
        buf.read_into(t).get()
    assert info.value.code == rdmabuf.StatusCode.NOT_FOUND
    assert not info.value.retryable

    async def write() -> None:
        await buf.write_from(t)

    with pytest.raises(rdmabuf.NotFoundError):
        asyncio.run(write())
