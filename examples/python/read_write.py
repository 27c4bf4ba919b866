"""Two processes: the owner registers a tensor, the reader reads it and writes back.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/read_write.py

The owner (this process) registers a torch tensor as an RDMABuffer and sends
it to a reader process it starts; multiprocessing pickles the buffer, which
sends only its handle (a few hundred bytes). The reader reads the tensor
into its own memory, awaiting the transfer, then writes new values into the
owner's tensor with a blocking get(). The owner's code takes no part in
either transfer; it only waits for the reader to say it is done.
"""

import asyncio
import multiprocessing

import torch

import rdmabuf


def reader(buf: rdmabuf.RDMABuffer, done: "multiprocessing.Queue[str]") -> None:
    print(f"reader: got {buf}")

    async def read() -> torch.Tensor:
        dst = torch.empty(buf.size() // 4, dtype=torch.float32)
        await buf.read_into(dst, timeout=10)  # remote -> local, awaited
        return dst

    weights = asyncio.run(read())
    print(f"reader: read {weights.numel()} floats, sum {weights.sum().item():.0f}")

    buf.write_from(weights * 2, timeout=10).get()  # local -> remote, blocking
    done.put("written")


def main() -> None:
    weights = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    buf = rdmabuf.RDMABuffer(weights)  # keeps `weights` alive until drop()
    print(f"owner: registered {buf.size()} bytes; handle {buf.to_text()[:32]}...")

    ctx = multiprocessing.get_context("spawn")
    done = ctx.Queue()
    proc = ctx.Process(target=reader, args=(buf, done))  # pickles the handle
    proc.start()
    print(f"owner: reader says {done.get(timeout=60)}")
    proc.join()

    assert torch.equal(weights, torch.arange(1 << 20, dtype=torch.float32) * 2)
    buf.drop()  # from now on the handle fails with NotFoundError
    print("OK")


if __name__ == "__main__":
    main()
