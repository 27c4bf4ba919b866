"""Shared fixtures of the Python tests (run by the CTest test `python`).

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # peers.py, for spawned children too

import rdmabuf  # noqa: E402

# Keep the tests short when something hangs: a transfer waits this long at most.
os.environ.setdefault("RDMABUF_TIMEOUT_MS", "20000")


@pytest.fixture(scope="session")
def spawn() -> Any:
    return multiprocessing.get_context("spawn")


class PeerProcess:
    """A spawned process that answers commands sent over a pipe (peers.py):
    an exception it answers is raised here."""

    conn: Any
    proc: Any

    def call(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
        if not self.conn.poll(60):
            raise RuntimeError(f"the peer process did not answer {cmd!r}")
        answer = self.conn.recv()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        try:
            self.call("exit")
        finally:
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.kill()


class Owner(PeerProcess):
    """A spawned process owning a numpy array and a torch tensor (peers.owner_main)."""

    def __init__(self, ctx: Any, backends: str = "", with_torch: bool = True) -> None:
        import peers  # needs numpy

        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=peers.owner_main, args=(child, backends, with_torch), daemon=True
        )
        self.proc.start()
        child.close()
        if not self.conn.poll(60):
            raise RuntimeError("the owner process did not start")
        self.buffers: Dict[str, rdmabuf.RDMABuffer] = self.conn.recv()

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The owner frozen (SIGSTOP): it accepts connections, answers nothing.
        Only a tcp owner stalls its readers: the same-host backend reads a
        stopped process's memory all the same."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            # The signal is delivered asynchronously: wait until every thread
            # of the owner is stopped.
            deadline = time.monotonic() + 10
            while not self._all_stopped():
                if time.monotonic() > deadline:
                    raise RuntimeError("the owner did not stop")
                time.sleep(0.001)
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def _all_stopped(self) -> bool:
        tasks = Path(f"/proc/{self.proc.pid}/task")
        for task in tasks.iterdir():
            try:
                stat = (task / "stat").read_text()
            except FileNotFoundError:  # the thread ended
                continue
            if stat.rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                return False
        return True

@pytest.fixture(scope="module")
def owner(spawn: Any) -> Iterator[Owner]:
    o = Owner(spawn)
    yield o
    o.close()


@pytest.fixture(scope="session")
def tcp_owner(spawn: Any) -> Iterator[Owner]:
    """An owner offering tcp only (numpy buffer only), for stalling with stopped()."""
    o = Owner(spawn, backends="tcp", with_torch=False)
    yield o
    o.close()
