"""Two processes talk over an Endpoint: messages, lent memory, a tagged write.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/endpoint.py

The server (this process) listens and starts a client process with the
address. The client sends a message and waits for the answer; then it asks
the server to lend it 1 MiB for 30 s, writes into that memory with a tag,
and sends the buffer back. The server learns of the write from its
notification, and gets its memory back with what the client wrote.
"""

import multiprocessing

import rdmabuf


def client(address: str) -> None:
    with rdmabuf.connect(address, timeout=10) as ep:
        print(f"client: connected, frames travel over {ep.channel}")
        ep.send(b"hello, server")
        answer = bytearray(64)
        n = ep.receive(answer, timeout=10)
        print(f"client: the server says {bytes(answer[:n])!r}")

        lease = ep.request_remote_buffer(1 << 20, lease=30)
        print(f"client: borrowed {lease.buffer.size()} bytes for {lease.granted:.0f} s")
        ep.write(lease.buffer, b"written by the client", tag=42, timeout=10)
        ep.send_buffer(lease.buffer)  # gives the memory back; our access ends


def main() -> None:
    with rdmabuf.listen("127.0.0.1:0") as listener:
        ctx = multiprocessing.get_context("spawn")
        proc = ctx.Process(target=client, args=(listener.address,))
        proc.start()
        ep = listener.accept(timeout=30)

    with ep:
        message = bytearray(64)
        n = ep.receive(message, timeout=30)
        print(f"server: got {bytes(message[:n])!r}")
        ep.send(b"hello, client")

        note = rdmabuf.next_notification(timeout=30)
        print(f"server: tagged write {note.tag}: {note.length} bytes landed")
        memory = ep.receive_local_buffer(timeout=30)
        assert bytes(memory[: note.length]) == b"written by the client"
        print(f"server: the lent memory came back holding {bytes(memory[:note.length])!r}")
    proc.join(30)
    assert proc.exitcode == 0
    print("OK")


if __name__ == "__main__":
    main()
