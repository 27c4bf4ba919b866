"""GPU memory from Python: arrays with __cuda_array_interface__ or DLPack
(and, on a real GPU, CUDA torch tensors) as registered buffers, as read and
write targets, and as endpoint messages.

On CI the GPU is the test driver's (tests/fake_cuda; gpu_arrays.py): its
memory faults on any host access, so the package must reach it through the
driver alone. RDMABUF_TEST_REAL_GPU=1 runs the same tests on a real GPU
(scripts/gpu-check.sh), where the torch tests run too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest

import gpu_arrays  # noqa: I001 (first: it picks the driver rdmabuf loads)
import rdmabuf
from conftest import Owner
from gpu_arrays import CudaArray, DlpackArray
from peers import NP_SIZE, pattern

np = pytest.importorskip("numpy")

if not os.environ.get("RDMABUF_TEST_CUDA_DRIVER") and os.environ.get("RDMABUF_TEST_REAL_GPU") != "1":
    pytest.skip(
        "neither the test CUDA driver (RDMABUF_TEST_CUDA_DRIVER, set by ctest) nor a real GPU "
        "(RDMABUF_TEST_REAL_GPU=1)",
        allow_module_level=True,
    )

BYTES = pattern(1 << 16).tobytes()


def test_gpu_array_is_a_buffer_read_into_host_and_gpu_memory() -> None:
    buf = rdmabuf.RDMABuffer(CudaArray(BYTES))
    host = bytearray(len(BYTES))
    assert buf.read_into(host).get(timeout=30) == len(BYTES)
    assert bytes(host) == BYTES
    gpu = CudaArray(bytes(len(BYTES)))
    assert buf.read_into(gpu).get(timeout=30) == len(BYTES)
    assert gpu.bytes() == BYTES
    buf.drop()


def test_write_from_gpu_into_host_and_gpu_buffers() -> None:
    src = CudaArray(BYTES[::-1])
    host = bytearray(len(BYTES))
    host_buf = rdmabuf.RDMABuffer(host)
    host_buf.write_from(src).get(timeout=30)
    assert bytes(host) == BYTES[::-1]
    target = CudaArray(bytes(len(BYTES)))
    gpu_buf = rdmabuf.RDMABuffer(target)
    gpu_buf.write_from(src).get(timeout=30)
    assert target.bytes() == BYTES[::-1]


def test_gpu_arrays_follow_the_rules_of_host_ones() -> None:
    with pytest.raises(ValueError, match="read-only"):
        rdmabuf.RDMABuffer(bytearray(16)).read_into(CudaArray(bytes(16), readonly=True))
    with pytest.raises(ValueError, match="stream 0"):
        rdmabuf.RDMABuffer(CudaArray(bytes(16), stream=0))
    with pytest.raises(ValueError, match="1-D"):
        rdmabuf.RDMABuffer(bytearray(16)).read_into(DlpackArray(bytes(16), shape=(4, 4)))


def test_a_stream_named_by_the_array_is_waited_for() -> None:
    legacy = CudaArray(BYTES, stream=1)  # the legacy default stream
    host = bytearray(len(BYTES))
    buf = rdmabuf.RDMABuffer(host)
    buf.write_from(legacy).get(timeout=30)
    assert bytes(host) == BYTES


def test_dlpack_array_is_taken_and_let_go_once() -> None:
    array = DlpackArray(bytes(len(BYTES)))
    buf = rdmabuf.RDMABuffer(bytearray(BYTES))
    assert buf.read_into(array).get(timeout=30) == len(BYTES)
    assert array.bytes() == BYTES
    assert array.streams_asked == [1], "asked to order its work before the legacy stream"
    assert array.deleted == 1, "the capsule's deleter ran once the read was done"


def test_endpoint_messages_from_and_into_gpu_memory() -> None:
    listener = rdmabuf.listen()
    accepted: list = []
    accepting = threading.Thread(target=lambda: accepted.append(listener.accept(timeout=30)))
    accepting.start()
    client = rdmabuf.connect(listener.address, timeout=30)
    accepting.join(30)
    server = accepted[0]
    for size in (0, 100, 5000, 300 << 10):
        data = pattern(size, seed=size % 200).tobytes()
        into = CudaArray(bytes(max(size, 1)))
        pending = server.post_receive(into)
        client.send(CudaArray(data) if size else bytearray(), timeout=10)
        assert pending.wait(timeout=10) == size
        assert into.bytes()[:size] == data
    client.close()
    server.close()
    listener.close()


@pytest.mark.parametrize("backends", ["memory", "tcp"])
def test_gpu_buffer_of_another_process(spawn: Any, backends: str) -> None:
    owner = Owner.__new__(Owner)
    owner.conn, child = spawn.Pipe()
    import peers

    owner.proc = spawn.Process(target=peers.gpu_owner_main, args=(child, backends), daemon=True)
    owner.proc.start()
    child.close()
    assert owner.conn.poll(60), "the GPU owner did not start"
    buf = owner.conn.recv()["gpu"]
    try:
        into = CudaArray(bytes(NP_SIZE))
        assert buf.read_into(into).get(timeout=30) == NP_SIZE
        assert into.bytes() == pattern(NP_SIZE).tobytes()
        src = CudaArray(pattern(NP_SIZE, seed=9).tobytes())
        buf.write_from(src).get(timeout=30)
        assert owner.call("bytes", "gpu") == pattern(NP_SIZE, seed=9).tobytes()
    finally:
        owner.call("exit")
        owner.proc.join(10)


def test_without_a_driver_gpu_memory_is_failed_precondition() -> None:
    # A process whose rdmabuf finds no driver, holding GPU memory made
    # through the test driver directly.
    if os.environ.get("RDMABUF_TEST_REAL_GPU") == "1":
        pytest.skip("needs the test driver: the GPU memory is made behind rdmabuf's back")
    code = (
        "import os, sys\n"
        "driver = os.environ['RDMABUF_CUDA_DRIVER']\n"
        "os.environ['RDMABUF_CUDA_DRIVER'] = '/nonexistent/libcuda.so.1'\n"
        "import gpu_arrays\n"
        "gpu_arrays.DRIVER_PATH = driver\n"
        "import rdmabuf\n"
        "try:\n"
        "    rdmabuf.RDMABuffer(gpu_arrays.CudaArray(bytes(64)))\n"
        "except rdmabuf.FailedPreconditionError as e:\n"
        "    print('FailedPrecondition:', e)\n"
        "    sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    env = dict(os.environ, RDMABUF_TEST_CUDA_DRIVER="")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no CUDA driver" in done.stdout


torch = pytest.importorskip("torch") if os.environ.get("RDMABUF_TEST_REAL_GPU") == "1" else None


@pytest.mark.skipif(
    torch is None or not torch.cuda.is_available(), reason="CUDA torch tensors need a real GPU"
)
def test_cuda_tensors_as_buffers_and_targets() -> None:
    assert torch is not None
    src = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    buf = rdmabuf.RDMABuffer(src)
    dst = torch.empty_like(src)
    assert buf.read_into(dst).get(timeout=30) == src.numel() * 4
    assert torch.equal(dst, src)
    # Work queued on the current stream is finished before the transfer reads.
    src.mul_(2)
    out = torch.empty(1 << 20, dtype=torch.float32)
    out_buf = rdmabuf.RDMABuffer(out)
    out_buf.write_from(src).get(timeout=30)
    assert torch.equal(out, src.cpu())
