"""The Python API in one process: data types, size rules, errors, lifetime,
serialization, batches and configuration."""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import threading
import time
import weakref
from typing import Any

import needs
import pytest

np = needs.module("numpy")
torch = needs.module("torch")

import peers
import rdmabuf
from rdmabuf import _manager


def registered() -> int:
    return _manager.default_manager().registered_count()


# --- Creating buffers -----------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(100, dtype=np.uint8),
        lambda: np.zeros(25, dtype=np.float32),
        lambda: torch.arange(25, dtype=torch.float32),
        lambda: torch.zeros(100, dtype=torch.uint8)[10:60],  # a contiguous view
        lambda: bytearray(100),
        lambda: memoryview(bytearray(100)),
        lambda: memoryview(np.zeros((10, 10), dtype=np.uint8)).cast("B"),
    ],
    ids=["numpy-u8", "numpy-f32", "torch-f32", "torch-view", "bytearray", "memoryview",
         "memoryview-cast"],
)
def test_buffer_from_each_kind_of_memory(make: Any) -> None:
    data = make()
    nbytes = data.numel() * data.element_size() if isinstance(data, torch.Tensor) else len(
        memoryview(data).cast("B")
    )
    buf = rdmabuf.RDMABuffer(data)
    assert buf.size() == nbytes
    assert buf.is_owner
    assert buf.owner.pid == os.getpid()
    assert str(buf.owner).startswith("manager ")
    dst = bytearray(nbytes)
    assert buf.read_into(dst).get() == nbytes
    src = memoryview(data).cast("B") if not isinstance(data, torch.Tensor) else None
    expected = bytes(src) if src is not None else data.numpy().tobytes()
    assert bytes(dst) == expected
    buf.drop()


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda: np.arange(100, dtype=np.uint8)[::2], "contiguous"),
        (lambda: torch.arange(100, dtype=torch.float32)[::2], "contiguous"),
        (lambda: memoryview(bytearray(100))[::2], "contiguous"),
        (lambda: np.zeros((4, 4), dtype=np.uint8), "1-D"),
        (lambda: torch.zeros(4, 4), "1-D"),
        (lambda: torch.tensor(1.0), "1-D"),
        (lambda: np.zeros(0, dtype=np.uint8), "0 bytes"),
        (lambda: torch.zeros(0), "0 bytes"),
        (lambda: bytearray(), "0 bytes"),
        (lambda: memoryview(b"read-only bytes"), "read-only"),
        (lambda: np.frombuffer(b"read-only bytes", dtype=np.uint8), "read-only"),
        (lambda: np.array([object(), object()], dtype=object), "Python objects"),
    ],
    ids=["numpy-strided", "torch-strided", "memoryview-strided", "numpy-2d", "torch-2d",
         "torch-0d", "numpy-empty", "torch-empty", "bytearray-empty", "bytes", "numpy-readonly",
         "numpy-objects"],
)
def test_bad_data_is_a_value_error(make: Any, what: str) -> None:
    before = registered()
    with pytest.raises(ValueError, match=what) as info:
        rdmabuf.RDMABuffer(make())
    assert isinstance(info.value, rdmabuf.InvalidArgumentError)
    assert info.value.code == rdmabuf.StatusCode.INVALID_ARGUMENT
    assert registered() == before


@pytest.mark.parametrize("data", [[1, 2, 3], 42, "text", None], ids=["list", "int", "str", "None"])
def test_other_types_are_a_type_error(data: Any) -> None:
    with pytest.raises(TypeError, match="1-D contiguous"):
        rdmabuf.RDMABuffer(data)


def test_tensor_not_on_the_cpu_is_unimplemented() -> None:
    meta = torch.empty(16, device="meta")
    with pytest.raises(rdmabuf.UnimplementedError, match="meta tensor") as info:
        rdmabuf.RDMABuffer(meta)
    assert isinstance(info.value, NotImplementedError)
    with pytest.raises(rdmabuf.UnimplementedError):
        rdmabuf.RDMABuffer(bytearray(16)).read_into(meta)


# --- Size rules and local memory ---------------------------------------------------


@pytest.fixture
def buf16() -> Any:
    data = np.arange(16, dtype=np.uint8)
    b = rdmabuf.RDMABuffer(data)
    yield b
    b.drop()


def test_read_into_needs_room_for_the_whole_buffer(buf16: Any) -> None:
    with pytest.raises(ValueError, match="less than the buffer's 16 B") as info:
        buf16.read_into(np.zeros(15, dtype=np.uint8))
    assert isinstance(info.value, rdmabuf.InvalidArgumentError)
    with pytest.raises(ValueError):
        buf16.read_into(torch.zeros(3))  # 12 B
    # Larger is fine: the front of dst is written, the rest untouched.
    dst = np.full(20, 255, dtype=np.uint8)
    assert buf16.read_into(dst).get() == 16
    assert list(dst) == list(range(16)) + [255] * 4


def test_write_from_must_fit_in_the_buffer(buf16: Any) -> None:
    with pytest.raises(ValueError, match="more than the buffer's 16 B"):
        buf16.write_from(np.zeros(17, dtype=np.uint8))
    with pytest.raises(ValueError):
        buf16.write_from(torch.zeros(5))  # 20 B
    # Smaller is fine: the front of the buffer is written. bytes work as a source.
    assert buf16.write_from(b"\xaa\xbb").get() == 2
    dst = bytearray(16)
    buf16.read_into(dst).get()
    assert dst[:3] == b"\xaa\xbb\x02"


def test_read_into_read_only_memory_is_refused(buf16: Any) -> None:
    for dst in (b"x" * 16, memoryview(bytearray(16)).toreadonly(),
                np.frombuffer(b"y" * 16, dtype=np.uint8)):
        with pytest.raises(ValueError, match="read-only"):
            buf16.read_into(dst)


def test_read_into_strided_or_2d_memory_works(buf16: Any) -> None:
    # Registered memory must be 1-D and contiguous; memory a transfer reads
    # into may be any dense array or tensor (test_ranges.py has more).
    every_other = np.zeros(64, dtype=np.uint8)
    assert buf16.read_into(every_other[::4]).get() == 16
    square = torch.zeros(4, 4, dtype=torch.uint8)
    assert buf16.read_into(square).get() == 16
    assert every_other[::4].tobytes() == bytes(range(16))
    assert square.numpy().tobytes() == bytes(range(16))
    assert every_other[1::4].tobytes() == bytes(16)


def test_bad_timeout_is_a_value_error(buf16: Any) -> None:
    with pytest.raises(ValueError, match="timeout"):
        buf16.read_into(bytearray(16), timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        buf16.read_into(bytearray(16), timeout=float("nan"))
    assert buf16.read_into(bytearray(16), timeout=float("inf")).get() == 16


# --- Errors ----------------------------------------------------------------------------


def test_error_classes() -> None:
    assert issubclass(rdmabuf.InvalidArgumentError, rdmabuf.Error)
    assert issubclass(rdmabuf.InvalidArgumentError, ValueError)
    assert issubclass(rdmabuf.DeadlineExceededError, TimeoutError)
    assert issubclass(rdmabuf.UnavailableError, ConnectionError)
    assert issubclass(rdmabuf.PermissionDeniedError, PermissionError)
    assert not issubclass(rdmabuf.NotFoundError, ValueError)
    e = rdmabuf.DeadlineExceededError("read of 8 B: too slow")
    assert e.code == rdmabuf.StatusCode.DEADLINE_EXCEEDED
    assert e.message == "read of 8 B: too slow"
    assert str(e) == "DeadlineExceeded: read of 8 B: too slow"
    assert e.retryable and not rdmabuf.NotFoundError("x").retryable
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is rdmabuf.DeadlineExceededError
    assert (again.code, again.message) == (e.code, e.message)
    assert rdmabuf.StatusCode.UNAVAILABLE.label == "Unavailable"


# --- Lifetime -----------------------------------------------------------------------


def test_buffer_keeps_its_tensor_alive_until_drop() -> None:
    t = torch.arange(1024, dtype=torch.float32)
    alive = weakref.ref(t)
    buf = rdmabuf.RDMABuffer(t)
    del t
    gc.collect()
    assert alive() is not None
    dst = torch.zeros(1024)
    buf.read_into(dst).get()
    assert dst[1023] == 1023.0
    before = registered()
    buf.drop()
    assert registered() == before - 1
    gc.collect()
    assert alive() is None
    buf.drop()  # idempotent


def test_collecting_the_owner_object_drops_the_buffer() -> None:
    t = torch.zeros(256)
    alive = weakref.ref(t)
    before = registered()
    buf = rdmabuf.RDMABuffer(t)
    handle = pickle.loads(pickle.dumps(buf))
    del t
    assert registered() == before + 1
    del buf
    gc.collect()
    assert registered() == before
    assert alive() is None
    with pytest.raises(rdmabuf.NotFoundError):
        handle.read_into(torch.zeros(256)).get()


def test_numpy_and_bytearray_kept_alive_and_not_resizable() -> None:
    data = bytearray(64)
    buf = rdmabuf.RDMABuffer(data)
    with pytest.raises(BufferError):
        data.extend(b"more")  # the registration holds a buffer export
    buf.drop()
    data.extend(b"more")  # released on drop
    assert len(data) == 68


def test_drop_then_read_fails() -> None:
    buf = rdmabuf.RDMABuffer(np.ones(32, dtype=np.uint8))
    handle = rdmabuf.RDMABuffer.from_bytes(buf.to_bytes())
    assert handle.read_into(bytearray(32)).get() == 32
    result = buf.drop()
    assert result.done() and result.get() is None
    with pytest.raises(rdmabuf.NotFoundError):
        handle.read_into(bytearray(32)).get()
    with pytest.raises(rdmabuf.NotFoundError):
        handle.write_from(b"abc").get()
    # The dropped object itself refuses at once.
    with pytest.raises(rdmabuf.NotFoundError, match="dropped"):
        buf.read_into(bytearray(32))
    with pytest.raises(rdmabuf.NotFoundError):
        buf.to_bytes()

    async def awaited_drop() -> None:
        await buf.drop()  # Monarch style; already done

    asyncio.run(awaited_drop())


def test_dropping_a_handle_releases_nothing() -> None:
    data = np.arange(32, dtype=np.uint8)
    buf = rdmabuf.RDMABuffer(data)
    copy = pickle.loads(pickle.dumps(buf))
    assert not copy.is_owner
    copy.drop()
    with pytest.raises(rdmabuf.NotFoundError):
        copy.read_into(bytearray(32))
    del copy
    gc.collect()
    again = rdmabuf.RDMABuffer.from_bytes(buf.to_bytes())
    assert again.read_into(bytearray(32)).get() == 32  # still registered
    buf.drop()


def test_future_holds_its_memory_until_done() -> None:
    owner_data = np.arange(1 << 20, dtype=np.uint8)
    buf = rdmabuf.RDMABuffer(owner_data)
    dst = torch.zeros(1 << 20, dtype=torch.uint8)
    alive = weakref.ref(dst)
    fut = buf.read_into(dst)
    del dst
    gc.collect()
    assert alive() is not None
    assert fut.get() == 1 << 20
    gc.collect()
    assert alive() is None  # let go once the result was taken
    buf.drop()


def test_dropping_an_unfinished_future_cancels_it() -> None:
    buf = rdmabuf.RDMABuffer(np.zeros(1 << 22, dtype=np.uint8))
    for _ in range(20):
        dst = np.empty(1 << 22, dtype=np.uint8)
        fut = buf.read_into(dst)
        del fut  # cancels if unfinished; dst is then free to go
        del dst
    gc.collect()
    assert buf.read_into(np.empty(1 << 22, dtype=np.uint8)).get() == 1 << 22
    buf.drop()


# --- Serialization --------------------------------------------------------------------


def test_pickle_round_trip() -> None:
    data = np.arange(256, dtype=np.uint8)
    buf = rdmabuf.RDMABuffer(data)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        copy = pickle.loads(pickle.dumps(buf, protocol=protocol))
        assert isinstance(copy, rdmabuf.RDMABuffer)
        assert copy.to_bytes() == buf.to_bytes()
        assert copy.size() == 256 and copy.owner == buf.owner and not copy.is_owner
        dst = np.zeros(256, dtype=np.uint8)
        copy.read_into(dst).get()
        assert np.array_equal(dst, data)
    # The pickle stream names the rebuild function and carries bytes only.
    assert b"_rebuild" in pickle.dumps(buf)
    text = buf.to_text()
    assert "\n" not in text
    assert rdmabuf.RDMABuffer.from_text(f"  {text}\n").to_bytes() == buf.to_bytes()
    buf.drop()


@pytest.mark.parametrize(
    "garbage", [b"", b"\x00" * 10, os.urandom(200), b"RDMB" + os.urandom(100)],
    ids=["empty", "zeros", "random", "magic-random"],
)
def test_garbage_handles_are_value_errors(garbage: bytes) -> None:
    with pytest.raises(ValueError) as info:
        rdmabuf.RDMABuffer.from_bytes(garbage)
    assert isinstance(info.value, rdmabuf.InvalidArgumentError)
    with pytest.raises(ValueError):
        rdmabuf.RDMABuffer.from_text("not a handle")


def test_truncated_and_altered_handles() -> None:
    buf = rdmabuf.RDMABuffer(bytearray(64))
    data = buf.to_bytes()
    with pytest.raises(rdmabuf.InvalidArgumentError):
        rdmabuf.RDMABuffer.from_bytes(data[:-1])
    altered = bytearray(data)
    altered[len(altered) // 2] ^= 0x40
    with pytest.raises(rdmabuf.InvalidArgumentError):
        rdmabuf.RDMABuffer.from_bytes(bytes(altered))
    buf.drop()


def test_slices() -> None:
    data = np.arange(100, dtype=np.uint8)
    buf = rdmabuf.RDMABuffer(data)
    s = buf.slice(10, 20)
    assert s.size() == 20 and not s.is_owner
    dst = np.zeros(20, dtype=np.uint8)
    s.read_into(dst).get()
    assert list(dst) == list(range(10, 30))
    s.write_from(np.full(5, 200, dtype=np.uint8)).get()
    assert list(data[8:17]) == [8, 9, 200, 200, 200, 200, 200, 15, 16]
    with pytest.raises(ValueError):
        buf.slice(90, 20)
    s.drop()  # a slice releases nothing
    assert buf.read_into(np.zeros(100, dtype=np.uint8)).get() == 100
    buf.drop()
    with pytest.raises(rdmabuf.NotFoundError):
        buf.slice(0, 1)


# --- Async and threads ----------------------------------------------------------------


def test_await_and_get_give_the_same_results() -> None:
    buf = rdmabuf.RDMABuffer(np.arange(64, dtype=np.uint8))

    async def main() -> Any:
        a = np.zeros(64, dtype=np.uint8)
        fut = buf.read_into(a)
        n1 = await fut
        n2 = await fut  # awaiting twice is fine
        n3 = fut.get()
        return n1, n2, n3, a

    n1, n2, n3, a = asyncio.run(main())
    assert n1 == n2 == n3 == 64
    assert np.array_equal(a, np.arange(64, dtype=np.uint8))
    buf.drop()


def test_futures_work_across_event_loops_and_threads() -> None:
    buf = rdmabuf.RDMABuffer(np.arange(256, dtype=np.uint8))
    results = []

    def worker() -> None:
        async def main() -> int:
            return sum(await asyncio.gather(*[buf.read_into(bytearray(256)) for _ in range(20)]))

        for _ in range(3):
            results.append(asyncio.run(main()))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [20 * 256] * 12
    buf.drop()


def test_blocking_get_releases_the_gil(tcp_owner: Any) -> None:
    buf = tcp_owner.buffers["np"].slice(0, 16)
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    thread = threading.Thread(target=spin, daemon=True)
    try:
        with tcp_owner.stopped():
            thread.start()
            time.sleep(0.01)
            start_ticks = ticks
            with pytest.raises(rdmabuf.DeadlineExceededError):
                buf.read_into(bytearray(16), timeout=0.5).get()
            during = ticks - start_ticks
    finally:
        stop.set()
        thread.join()
    # The spinning thread ran while the main thread waited in get().
    assert during > 10000


def test_awaiting_does_not_spin_and_cancelling_the_task_cancels(tcp_owner: Any) -> None:
    buf = tcp_owner.buffers["np"].slice(0, 16)
    dst = bytearray(16)
    with tcp_owner.stopped():

        async def wait_it_out() -> float:
            cpu0 = time.process_time()
            with pytest.raises(rdmabuf.DeadlineExceededError):
                await buf.read_into(dst, timeout=0.8)
            return time.process_time() - cpu0

        cpu = asyncio.run(wait_it_out())
        assert cpu < 0.3, f"awaiting a stalled transfer burnt {cpu:.2f} s of CPU in 0.8 s"

        async def cancel_it() -> Any:
            fut = buf.read_into(dst, timeout=30)
            task = asyncio.ensure_future(fut)
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return fut

        fut = asyncio.run(cancel_it())
        assert fut.done()
        with pytest.raises(rdmabuf.CancelledError):
            fut.get()

        # Future.cancel() from the caller, and get() with its own limit.
        fut = buf.read_into(dst, timeout=30)
        with pytest.raises(TimeoutError) as info:
            fut.get(timeout=0.1)
        assert not isinstance(info.value, rdmabuf.Error)  # the transfer goes on
        assert not fut.done()
        assert fut.cancel()
        with pytest.raises(rdmabuf.CancelledError):
            fut.get()
    # The owner is back: the next read recovers.
    assert buf.read_into(dst, timeout=30).get() == 16


def test_signal_handler_runs_during_get_and_cancels(tcp_owner: Any) -> None:
    """A blocked get() still runs signal handlers (Ctrl-C); what they raise
    cancels the transfer and propagates."""
    import signal

    class Interrupted(Exception):
        pass

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted()

    buf = tcp_owner.buffers["np"].slice(0, 16)
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with tcp_owner.stopped():
            fut = buf.read_into(bytearray(16), timeout=30)
            timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
            timer.start()
            start = time.monotonic()
            with pytest.raises(Interrupted):
                fut.get()
            assert time.monotonic() - start < 5
            timer.join()
            assert fut.done()
            with pytest.raises(rdmabuf.CancelledError):
                fut.get()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_future_started_without_a_loop_can_be_awaited(tcp_owner: Any) -> None:
    """Started from synchronous code (no completion callback), awaited later."""
    buf = tcp_owner.buffers["np"].slice(0, 16)
    dst = bytearray(16)
    fut = buf.read_into(dst)

    async def wait_for(f: Any) -> Any:
        return await f

    assert asyncio.run(wait_for(fut)) == 16
    assert dst == peers.pattern(16).tobytes()
    with tcp_owner.stopped():
        fut = buf.read_into(dst, timeout=0.5)
        cpu0 = time.process_time()
        with pytest.raises(rdmabuf.DeadlineExceededError):
            asyncio.run(wait_for(fut))
        assert time.process_time() - cpu0 < 0.3

        async def cancel_it() -> None:
            f = buf.read_into(dst, timeout=30)
            await asyncio.sleep(0)
            return f

        # Started inside a loop, waited on outside it.
        fut = asyncio.run(cancel_it())
        with pytest.raises(TimeoutError):
            fut.get(timeout=0.1)
        fut.cancel()
        with pytest.raises(rdmabuf.CancelledError):
            fut.get()


# --- Batches -------------------------------------------------------------------------


def test_action_batches_reads_and_writes() -> None:
    a = np.arange(64, dtype=np.uint8)
    b = torch.zeros(16, dtype=torch.float32)
    buf_a = rdmabuf.RDMABuffer(a)
    buf_b = rdmabuf.RDMABuffer(b)
    out_a = np.zeros(64, dtype=np.uint8)
    src_b = torch.full((16,), 3.0)
    action = rdmabuf.RDMAAction().read_remote(out_a, buf_a).write_remote(buf_b, src_b)
    assert len(action) == 2
    assert action.submit(timeout=10).get() is None
    assert np.array_equal(out_a, a)
    assert bool((b == 3.0).all())

    async def again() -> None:
        out_a[:] = 0
        await action.submit()

    asyncio.run(again())  # an action can be submitted again
    assert np.array_equal(out_a, a)
    buf_a.drop()
    buf_b.drop()


def test_action_size_and_overlap_checks() -> None:
    buf = rdmabuf.RDMABuffer(np.zeros(32, dtype=np.uint8))
    with pytest.raises(ValueError, match="less than"):
        rdmabuf.RDMAAction().read_remote(np.zeros(31, dtype=np.uint8), buf)
    with pytest.raises(ValueError, match="more than"):
        rdmabuf.RDMAAction().write_remote(buf, np.zeros(33, dtype=np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        rdmabuf.RDMAAction().read_remote(b"x" * 32, buf)
    local = np.zeros(64, dtype=np.uint8)
    # Two reads into overlapping memory, or a read into memory a write sends: refused.
    with pytest.raises(ValueError, match="overlaps"):
        rdmabuf.RDMAAction().read_remote(local[:32], buf).read_remote(local[16:48], buf).submit()
    with pytest.raises(ValueError, match="overlaps"):
        rdmabuf.RDMAAction().write_remote(buf, local[:32]).read_remote(local[8:40], buf).submit()
    # Writes from the same memory, and disjoint reads, are fine.
    rdmabuf.RDMAAction().write_remote(buf, local[:32]).write_remote(buf, local[:16]).submit().get()
    rdmabuf.RDMAAction().read_remote(local[:32], buf).read_remote(local[32:], buf).submit().get()
    buf.drop()


def test_action_reports_the_first_failed_op() -> None:
    good = rdmabuf.RDMABuffer(np.ones(16, dtype=np.uint8))
    gone = rdmabuf.RDMABuffer(np.ones(16, dtype=np.uint8))
    handle = rdmabuf.RDMABuffer.from_bytes(gone.to_bytes())
    gone.drop()
    out = np.zeros(48, dtype=np.uint8)
    action = (
        rdmabuf.RDMAAction()
        .read_remote(out[:16], good)
        .read_remote(out[16:32], handle)
        .read_remote(out[32:], good)
    )
    with pytest.raises(rdmabuf.NotFoundError) as info:
        action.submit().get()
    assert info.value.op_index == 1
    assert out[:16].all() and out[32:].all()  # the others still ran
    good.drop()


# --- Backends and configuration ----------------------------------------------------------


def test_backends() -> None:
    infos = rdmabuf.backends()
    assert [b for b in infos if b.name == "tcp" and b.viable]
    for b in infos:
        name, viable, reason = b
        assert isinstance(name, str) and isinstance(viable, bool) and isinstance(reason, str)
        assert viable or reason


def test_config_in_effect() -> None:
    cfg = rdmabuf.config()
    assert isinstance(cfg, rdmabuf.Config)
    assert cfg.timeout_ms == 20000  # conftest sets RDMABUF_TIMEOUT_MS
    assert cfg.tcp_streams >= 1 and cfg.chunk_size >= 4096
    with pytest.raises(rdmabuf.FailedPreconditionError):
        rdmabuf.configure(tcp_streams=2)  # in use already


def test_configure_before_first_use(spawn: Any) -> None:
    conn, child = spawn.Pipe()
    proc = spawn.Process(target=peers.configure_main, args=(child,), daemon=True)
    proc.start()
    child.close()
    assert conn.poll(60)
    out = conn.recv()
    proc.join(30)
    if isinstance(out, Exception):
        raise out
    assert out["unknown_field"] == "TypeError"
    assert out["bad_value"] == ("InvalidArgumentError", True)
    for key in ("returned", "before_use", "in_use"):
        cfg = out[key]
        assert (cfg.backends, cfg.tcp_streams, cfg.chunk_size, cfg.timeout_ms) == (
            ("tcp",), 3, 512 * 1024, 1234), key
    assert out["buffer_backends"] == ["tcp"]
    assert out["too_late"] == "FailedPreconditionError"
    assert out["after_shutdown"] == 5 and out["new_manager"] == 5


def test_forked_child_gets_its_own_manager() -> None:
    import multiprocessing

    data = np.arange(128, dtype=np.uint8)
    buf = rdmabuf.RDMABuffer(data)
    parent_manager = buf.owner.manager_id
    ctx = multiprocessing.get_context("fork")
    conn, child = ctx.Pipe()

    def in_child() -> None:
        try:
            dst = np.zeros(128, dtype=np.uint8)
            n = buf.read_into(dst).get(timeout=30)  # through a new manager
            mine = rdmabuf.RDMABuffer(np.zeros(8, dtype=np.uint8))
            buf.drop()  # must not release the parent's buffer
            child.send((n, dst.tobytes(), mine.owner.manager_id, mine.owner.pid))
        except Exception as e:
            child.send(e)

    proc = ctx.Process(target=in_child)
    proc.start()
    assert conn.poll(60)
    out = conn.recv()
    proc.join(30)
    if isinstance(out, Exception):
        raise out
    n, got, child_manager, child_pid = out
    assert n == 128 and got == data.tobytes()
    assert child_manager != parent_manager and child_pid == proc.pid
    assert buf.read_into(bytearray(128)).get() == 128  # still registered here
    buf.drop()
