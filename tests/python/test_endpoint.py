"""Endpoints from Python, against a peer in another process (peers.endpoint_peer_main):
messages, flow-control errors, handles, lent memory, tagged writes, a dead
peer. Each runs over the shared-memory channel and over plain tcp."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import numpy as np
import pytest

import rdmabuf


class Peer:
    """A spawned process with one endpoint connected to us (`self.ep`)."""

    def __init__(self, ctx: Any, backends: str) -> None:
        import peers

        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=peers.endpoint_peer_main, args=(child, backends), daemon=True
        )
        self.proc.start()
        child.close()
        if not self.conn.poll(60):
            raise RuntimeError("the endpoint peer did not start")
        self.ep = rdmabuf.connect(self.conn.recv(), timeout=30)

    def start(self, *cmd: Any) -> None:
        self.conn.send(cmd)

    def result(self) -> Any:
        if not self.conn.poll(60):
            raise RuntimeError("the endpoint peer did not answer")
        answer = self.conn.recv()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def call(self, *cmd: Any) -> Any:
        self.start(*cmd)
        return self.result()

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("exit")
            except Exception:
                pass
        self.ep.close()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


@pytest.fixture(params=["tcp", "memory,tcp"], ids=["tcp", "shm"])
def peer(request: Any, spawn: Any) -> Iterator[Peer]:
    # This process's manager offers what the peer offers, so that "tcp"
    # really means no shared memory on either side.
    before = rdmabuf.config().backends
    rdmabuf.shutdown()
    rdmabuf.configure(backends=request.param)
    p = Peer(spawn, request.param)
    yield p
    p.close()
    rdmabuf.shutdown()
    rdmabuf.configure(backends=",".join(before))


def test_the_channel_is_the_one_both_sides_allow(peer: Peer) -> None:
    shared = "memory" in rdmabuf.config().backends
    assert (peer.ep.channel == "shared memory") == shared, peer.ep.channel
    theirs = peer.call("channel")
    if shared:
        assert theirs == "shared memory"
    else:  # each side says why, from where it stands
        assert "memory backend: not enabled" in peer.ep.channel
        assert theirs.startswith("tcp (shared memory: the peer: its memory backend"), theirs
        assert "; RDMA: " in theirs, theirs
    assert peer.ep.peer.startswith("127.0.0.1:")


def test_messages_keep_their_boundaries_and_order(peer: Peer) -> None:
    sizes = [0, 1, 4096, 4097, 100_000, 7, 65536] * 3
    messages = [bytes((i * 31 + j) % 256 for j in range(n)) for i, n in enumerate(sizes)]
    peer.start("echo", len(messages), 1 << 20)
    into = np.zeros(1 << 20, dtype=np.uint8)  # any writable buffer will do
    for m in messages:
        peer.ep.send(m)
        n = peer.ep.receive(into)
        assert n == len(m)
        assert into[:n].tobytes() == m
    assert peer.result() is None


def test_posted_sends_and_receives_keep_a_window_in_flight(peer: Peer) -> None:
    sizes = [5, 70_000, 4096, 300_000, 0, 9000] * 2
    messages = [bytes((i * 7 + j) % 251 for j in range(n)) for i, n in enumerate(sizes)]
    peer.start("echo", len(messages), 1 << 20)
    echoes = [bytearray(1 << 20) for _ in messages]
    receiving = [peer.ep.post_receive(into) for into in echoes]  # filled in this order
    sending = [peer.ep.post_send(m) for m in messages]  # from one thread, no waiting
    with pytest.raises(BufferError):  # the posted receive holds its memory
        echoes[0].extend(b"x")
    for s in sending:
        assert s.wait(timeout=30) is None
    for m, r, into in zip(messages, receiving, echoes):
        n = r.wait(timeout=30)
        assert n == len(m) and bytes(into[:n]) == m
    echoes[0].extend(b"x")  # let go once waited for
    with pytest.raises(rdmabuf.FailedPreconditionError):
        receiving[0].wait(timeout=1)
    assert peer.result() is None


def test_a_posted_receive_dropped_unwaited_takes_no_message(peer: Peer) -> None:
    dropped = bytearray(64)
    pending = peer.ep.post_receive(dropped)
    del pending  # withdrawn
    into = bytearray(64)
    kept = peer.ep.post_receive(into)
    # The withdrawal travels in the endpoint's frames: a send the peer
    # began before reading it could take the dropped receive and be dropped
    # with it. The pipe to the peer may overtake those frames, so the
    # peer first receives a message sent after the withdrawal.
    peer.start("receive", 64, 30)
    peer.ep.send(b"after the withdrawal")
    assert peer.result() == b"after the withdrawal"
    peer.start("send", b"for the kept one")
    assert into[: kept.wait(timeout=30)] == b"for the kept one"
    assert peer.result() is None
    assert dropped == bytearray(64)


def test_a_message_larger_than_the_receive_fails_both_sides(peer: Peer) -> None:
    peer.start("receive", 1000, 30)
    with pytest.raises(rdmabuf.InvalidArgumentError) as sent:
        peer.ep.send(bytes(1001))
    assert isinstance(sent.value, ValueError)
    with pytest.raises(rdmabuf.InvalidArgumentError):
        peer.result()
    # Nothing was lost or half-delivered: the next message arrives whole.
    peer.start("receive", 1000, 30)
    peer.ep.send(b"next")
    assert peer.result() == b"next"


def test_a_receive_with_no_message_times_out_and_the_endpoint_goes_on(peer: Peer) -> None:
    into = bytearray(64)
    start = time.monotonic()
    with pytest.raises(rdmabuf.DeadlineExceededError) as late:
        peer.ep.receive(into, timeout=0.2)
    assert isinstance(late.value, TimeoutError)
    assert 0.15 < time.monotonic() - start < 5
    peer.start("send", b"after")
    assert into[: peer.ep.receive(into, timeout=30)] == b"after"
    assert peer.result() is None


def test_a_handle_passed_over_the_endpoint_reads_our_memory(peer: Peer) -> None:
    data = np.arange(5000, dtype=np.uint8)
    buf = rdmabuf.RDMABuffer(data)
    peer.start("read_buffer", 30)
    peer.ep.send_buffer(buf)
    assert peer.result() == data.tobytes()
    buf.drop().get()


def test_lent_memory_takes_a_tagged_write_and_comes_back_with_it(peer: Peer) -> None:
    lease = peer.ep.request_remote_buffer(4096, 30)
    assert lease.buffer.size() == 4096
    assert 0 < lease.granted <= 30
    payload = bytes(range(256)) * 4
    peer.start("notification", 30)
    peer.ep.write(lease.buffer, payload, tag=0xFEED)
    note = peer.result()
    assert (note.tag, note.length) == (0xFEED, len(payload))
    assert note.buffer_id == lease.buffer._handle.id
    # The peer gets its memory back, with what was written.
    peer.start("local_buffer", 30)
    peer.ep.send_buffer(lease.buffer)
    returned = peer.result()
    assert returned[: len(payload)] == payload and len(returned) == 4096
    # And our access has ended.
    with pytest.raises(rdmabuf.NotFoundError):
        lease.buffer.read_into(bytearray(4096), timeout=10).get()


def test_a_lease_that_ends_refuses_access_unless_renewed(peer: Peer) -> None:
    # `kept` is renewed well within its first lease (so a slow machine does
    # not fail the test) and used after that lease would have ended.
    kept = peer.ep.request_remote_buffer(64, 2.0)
    ended = peer.ep.request_remote_buffer(64, 0.3)
    assert peer.ep.renew(kept.buffer, 30) > 2
    time.sleep(2.5)
    kept.buffer.write_from(b"still mine", timeout=10).get()
    with pytest.raises(rdmabuf.NotFoundError):
        ended.buffer.write_from(b"too late", timeout=10).get()
    with pytest.raises(rdmabuf.NotFoundError):
        peer.ep.renew(ended.buffer, 30)


def test_bad_arguments_are_refused_before_anything_moves(peer: Peer) -> None:
    with pytest.raises(rdmabuf.InvalidArgumentError):
        peer.ep.request_remote_buffer(0, 10)
    with pytest.raises(rdmabuf.InvalidArgumentError):
        peer.ep.request_remote_buffer(64, 0)
    with pytest.raises(ValueError):
        peer.ep.write(peer.ep.request_remote_buffer(8, 10).buffer, b"x", tag=1 << 32)
    with pytest.raises(rdmabuf.InvalidArgumentError):
        peer.ep.write(peer.ep.request_remote_buffer(8, 10).buffer, bytes(9), tag=1)
    with pytest.raises(rdmabuf.InvalidArgumentError):
        peer.ep.receive(b"read-only bytes")
    with pytest.raises(TypeError):
        peer.ep.send("text is not bytes")  # type: ignore[arg-type]
    with pytest.raises(rdmabuf.InvalidArgumentError):
        peer.ep.receive(np.zeros((4, 4), dtype=np.uint8)[:, 1])  # not contiguous


def test_a_peer_that_dies_fails_the_waiting_call(peer: Peer) -> None:
    into = bytearray(64)
    peer.proc.kill()
    peer.proc.join()
    with pytest.raises(rdmabuf.UnavailableError) as gone:
        peer.ep.receive(into, timeout=30)
    assert isinstance(gone.value, ConnectionError)


def test_connect_to_nothing_and_accept_with_nobody_fail_cleanly() -> None:
    with rdmabuf.listen() as listener:
        with pytest.raises(rdmabuf.DeadlineExceededError):
            listener.accept(timeout=0.1)
        address = listener.address
    with pytest.raises(rdmabuf.UnavailableError):
        rdmabuf.connect(address, timeout=5)
    with pytest.raises(rdmabuf.InvalidArgumentError):
        rdmabuf.connect("no port here", timeout=5)


def test_closing_a_listener_wakes_an_accept_in_another_thread() -> None:
    listener = rdmabuf.listen()
    raised: list[BaseException] = []

    def accept() -> None:
        try:
            listener.accept(timeout=60)
        except BaseException as e:  # noqa: B036 (handed to the test thread)
            raised.append(e)

    waiting = threading.Thread(target=accept)
    waiting.start()
    time.sleep(0.2)
    listener.close()
    waiting.join(10)
    assert not waiting.is_alive(), "close() did not wake accept()"
    assert len(raised) == 1 and isinstance(raised[0], rdmabuf.CancelledError), raised
    with pytest.raises(rdmabuf.CancelledError):
        listener.accept(timeout=1)
    with pytest.raises(rdmabuf.UnavailableError):
        rdmabuf.connect(listener.address, timeout=5)
    listener.close()  # idempotent


def test_an_endpoint_still_describes_itself_after_shutdown() -> None:
    with rdmabuf.listen() as listener:
        connected: list[rdmabuf.Endpoint] = []
        connecting = threading.Thread(
            target=lambda: connected.append(rdmabuf.connect(listener.address, timeout=30))
        )
        connecting.start()
        accepted = listener.accept(timeout=30)
        connecting.join(30)
    rdmabuf.shutdown()
    assert "peer=" in repr(accepted) and "peer=" in repr(connected[0])
    with pytest.raises(rdmabuf.FailedPreconditionError):
        accepted.send(b"x", timeout=1)
    accepted.close()
    connected[0].close()
