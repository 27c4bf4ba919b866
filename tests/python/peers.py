"""Entry points of the processes the tests start with multiprocessing (spawn).

Kept out of the test modules so that a spawned child imports only this file
(and rdmabuf, numpy, torch), not pytest's test collection.
"""

from __future__ import annotations

import asyncio
import os
import traceback
from typing import Any, Dict, Tuple

import numpy as np

import rdmabuf

NP_SIZE = 1 << 20  # 1 MiB of uint8: byte i is (i * 7 + 3) % 251
TORCH_NUMEL = 1 << 16  # float32: element i is float(i)


def pattern(n: int, seed: int = 3) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 7 + seed) % 251).astype(np.uint8)


def owner_main(conn: Any, backends: str = "", with_torch: bool = True) -> None:
    """Owns a numpy array and (with_torch) a torch tensor; answers commands on `conn`.

    `backends`: what the owner offers (e.g. "tcp": a reader can then not
    bypass a stopped owner through the same-host backend). Sends
    {"np": RDMABuffer, "torch": RDMABuffer} (pickled handles) first, then
    obeys: ("bytes", name) -> the buffer's current bytes; ("drop", name) ->
    drops it, answers None; ("exit",) -> answers None and returns.
    """
    if backends:
        rdmabuf.configure(backends=backends)
    array = pattern(NP_SIZE)
    memory: Dict[str, Any] = {"np": array}
    if with_torch:
        import torch

        memory["torch"] = torch.arange(TORCH_NUMEL, dtype=torch.float32)
    owned = {name: rdmabuf.RDMABuffer(data) for name, data in memory.items()}
    conn.send(owned)
    while True:
        cmd = conn.recv()
        try:
            if cmd[0] == "bytes":
                data = memory[cmd[1]]
                conn.send(bytes(data.numpy().tobytes() if hasattr(data, "numpy") else data))
            elif cmd[0] == "drop":
                owned[cmd[1]].drop()
                conn.send(None)
            elif cmd[0] == "exit":
                conn.send(None)
                return
            else:
                conn.send(ValueError(f"unknown command {cmd!r}"))
        except Exception as e:  # reported to the test, which fails
            conn.send(RuntimeError(traceback.format_exc()))
            del e


def reader_main(handles: Dict[str, rdmabuf.RDMABuffer], conn: Any) -> None:
    """Given the test process's buffers (unpickled from the Process
    arguments): reads both, writes both, and reports what it read and
    whether the errors it provoked were the right ones."""
    import torch

    try:
        out: Dict[str, Any] = {"pid": os.getpid()}
        np_buf = handles["np"]
        t_buf = handles["torch"]
        assert not np_buf.is_owner and np_buf.owner.pid != os.getpid()

        # Read into numpy (blocking) and into torch (awaited).
        dst = np.zeros(np_buf.size(), dtype=np.uint8)
        out["np_read"] = np_buf.read_into(dst).get(timeout=30)
        out["np_bytes"] = dst.tobytes()

        async def read_tensor() -> Tuple[int, bytes]:
            t = torch.zeros(t_buf.size() // 4, dtype=torch.float32)
            n = await t_buf.read_into(t, timeout=30)
            return n, t.numpy().tobytes()

        out["torch_read"], out["torch_bytes"] = asyncio.run(read_tensor())

        # Write a new pattern into both: numpy from a torch tensor, and back.
        src = torch.from_numpy(pattern(np_buf.size(), seed=11))
        out["np_written"] = np_buf.write_from(src).get()
        out["torch_written"] = t_buf.write_from(
            np.full(t_buf.size() // 4, 2.5, dtype=np.float32)
        ).get()

        # A destination too small is a ValueError, before any transfer.
        try:
            np_buf.read_into(np.zeros(10, dtype=np.uint8))
            out["small_dst"] = "no error"
        except ValueError as e:
            out["small_dst"] = type(e).__name__
        conn.send(out)
    except Exception:
        conn.send(RuntimeError(traceback.format_exc()))


def adder_main(word: rdmabuf.RDMABuffer, count: int, conn: Any) -> None:
    """Adds 1 to the remote `word` `count` times, in RDMAActions of 10 adds;
    sends the previous values it saw (a list), or the exception."""
    try:
        seen = np.zeros(count, dtype=np.uint64)
        for start in range(0, count, 10):
            action = rdmabuf.RDMAAction()
            for i in range(start, min(start + 10, count)):
                action.fetch_add(word, seen[i:i + 1], 1)
            action.submit().get()
        conn.send(seen.tolist())
    except Exception as e:  # reported to the test, which fails
        conn.send(RuntimeError(traceback.format_exc()))


def configure_main(conn: Any) -> None:
    """configure() and config() in a fresh process (rdmabuf unused before)."""
    results: Dict[str, Any] = {}
    try:
        try:
            rdmabuf.configure(no_such_field=1)
        except TypeError:
            results["unknown_field"] = "TypeError"
        try:
            rdmabuf.configure(tcp_streams=0)
        except rdmabuf.InvalidArgumentError as e:
            results["bad_value"] = ("InvalidArgumentError", isinstance(e, ValueError))
        cfg = rdmabuf.configure(backends="tcp", tcp_streams=3, chunk_size="512K", timeout_ms=1234)
        results["returned"] = cfg
        results["before_use"] = rdmabuf.config()
        buf = rdmabuf.RDMABuffer(bytearray(16))
        results["in_use"] = rdmabuf.config()
        results["buffer_backends"] = buf.backends
        try:
            rdmabuf.configure(tcp_streams=5)
        except rdmabuf.FailedPreconditionError:
            results["too_late"] = "FailedPreconditionError"
        rdmabuf.shutdown()
        results["after_shutdown"] = rdmabuf.configure(tcp_streams=5).tcp_streams
        results["new_manager"] = rdmabuf.config().tcp_streams
        conn.send(results)
    except Exception:
        conn.send(RuntimeError(traceback.format_exc()))


def endpoint_peer_main(conn: Any, backends: str = "") -> None:
    """Listens for one endpoint and, once connected, obeys commands on `conn`.

    Sends the listener's address first. Each command runs against the
    endpoint and answers its result (or the exception it raised):
    ("receive", capacity, timeout) -> the message's bytes;
    ("echo", count, capacity) -> receives `count` messages, sends each back,
    answers None; ("send", data) -> None; ("notification", timeout) -> the
    Notification; ("local_buffer", timeout) -> the returned lent memory's
    bytes; ("read_buffer", timeout) -> receives a handle, reads it, answers
    its bytes; ("channel",) -> the endpoint's channel; ("exit",) -> None, and
    returns.
    """
    if backends:
        rdmabuf.configure(backends=backends)
    listener = rdmabuf.listen("127.0.0.1:0")
    conn.send(listener.address)
    ep = listener.accept(timeout=60)
    while True:
        cmd = conn.recv()
        try:
            answer: Any = None
            if cmd[0] == "receive":
                into = bytearray(cmd[1])
                answer = bytes(into[: ep.receive(into, timeout=cmd[2])])
            elif cmd[0] == "echo":
                into = bytearray(cmd[2])
                for _ in range(cmd[1]):
                    n = ep.receive(into, timeout=30)
                    ep.send(memoryview(into)[:n], timeout=30)
            elif cmd[0] == "send":
                ep.send(cmd[1], timeout=30)
            elif cmd[0] == "notification":
                answer = rdmabuf.next_notification(timeout=cmd[1])
            elif cmd[0] == "local_buffer":
                answer = bytes(ep.receive_local_buffer(timeout=cmd[1]))
            elif cmd[0] == "read_buffer":
                buf = ep.receive_buffer(timeout=cmd[1])
                dst = bytearray(buf.size())
                buf.read_into(dst).get()
                answer = bytes(dst)
            elif cmd[0] == "channel":
                answer = ep.channel
            elif cmd[0] == "exit":
                conn.send(None)
                ep.close()
                return
            else:
                answer = ValueError(f"unknown command {cmd!r}")
            conn.send(answer)
        except rdmabuf.Error as e:  # the test checks which
            conn.send(e)
        except Exception:  # reported to the test, which fails
            conn.send(RuntimeError(traceback.format_exc()))


def gpu_owner_main(conn: Any, backends: str = "") -> None:
    """Owns a GPU array (gpu_arrays.CudaArray, NP_SIZE bytes of pattern()):
    sends {"gpu": RDMABuffer} first, then obeys ("bytes", "gpu") -> its bytes,
    ("exit",) -> None."""
    import gpu_arrays  # sets the driver before rdmabuf uses GPU memory

    if backends:
        rdmabuf.configure(backends=backends)
    array = gpu_arrays.CudaArray(pattern(NP_SIZE).tobytes())
    owned = {"gpu": rdmabuf.RDMABuffer(array)}
    conn.send(owned)
    while True:
        cmd = conn.recv()
        if cmd[0] == "bytes":
            conn.send(array.bytes())
        elif cmd[0] == "exit":
            conn.send(None)
            return
        else:
            conn.send(ValueError(f"unknown command {cmd!r}"))


def maps_file_main(conn: Any) -> None:
    """A reader of buffers in shared files (test_empty.py): obeys commands on
    `conn`, each answered with its result (or the exception it raised):
    ("read", handle, file) -> (the handle's bytes, whether this process now
    maps `file`, a (device, inode) pair as /proc/self/maps spells them);
    ("write", handle, data) -> the bytes written from `data` into the handle;
    ("exit",) -> None, and returns."""
    while True:
        cmd = conn.recv()
        try:
            answer: Any = None
            if cmd[0] == "read":
                buf, file = cmd[1], cmd[2]
                dst = np.zeros(buf.size(), dtype=np.uint8)
                buf.read_into(dst).get(timeout=30)
                answer = (dst.tobytes(), maps_file(file))
            elif cmd[0] == "write":
                answer = cmd[1].write_from(np.frombuffer(cmd[2], dtype=np.uint8)).get(timeout=30)
            elif cmd[0] == "exit":
                conn.send(None)
                return
            else:
                answer = ValueError(f"unknown command {cmd!r}")
            conn.send(answer)
        except Exception:  # reported to the test, which fails
            conn.send(RuntimeError(traceback.format_exc()))


def maps_file(file: Tuple[str, str]) -> bool:
    """Whether this process maps the file (device, inode) (/proc/self/maps' spelling)."""
    with open("/proc/self/maps") as maps:
        return any(tuple(line.split()[3:5]) == file for line in maps)
