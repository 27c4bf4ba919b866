"""rdmabuf across hosts: each test makes hosts of its own on this machine
(scripts/netns_hosts.py: network, PID, UTS and mount namespaces, joined by
a virtual link) and runs real jobs across them: torchrun with c10d
rendezvous, mpirun, a host that dies mid-transfer. Run by the CTest test
`hosts` (as root):

    PYTHONPATH=build/python RDMABUF_TEST_BUILD_DIR=build \\
        /usr/bin/python3 -m pytest -q tests/hosts
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest

REPO = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).parent / "jobs"
from rdmabuf.netns_hosts import Hosts, can_make_hosts

BUILD = Path(os.environ.get("RDMABUF_TEST_BUILD_DIR", REPO / "build"))
TOOL = os.environ.get("RDMABUF_TOOL", str(BUILD / "tools" / "rdmabuf"))
PYTHON = "/usr/bin/python3"


if not can_make_hosts():
    why = "cannot make network namespaces here (needs root or CAP_SYS_ADMIN)"
    if os.environ.get("RDMABUF_TEST_STRICT") == "1":
        raise RuntimeError(f"RDMABUF_TEST_STRICT=1 and {why}")
    pytest.skip(why, allow_module_level=True)


@pytest.fixture
def hosts(request: pytest.FixtureRequest) -> Iterator[Hosts]:
    count = getattr(request, "param", 2)
    with Hosts(count) as made:
        yield made


def _wait_all(procs: List[subprocess.Popen], timeout: float) -> List[str]:
    """Each process's output, after all exited (killed at the timeout: the
    command, through nsenter; what it started dies with its host when the
    test ends)."""
    deadline = time.monotonic() + timeout
    outputs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            try:
                out, _ = p.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a child of it holds the pipe
                out = ""
            out += "\n(killed at the timeout)"
        outputs.append(out)
    return outputs


def _lines(stream: Any) -> "queue.Queue[str]":
    """`stream`'s lines, read by a thread ("" at the end), so that a test
    can wait for the next one with a timeout."""
    lines: "queue.Queue[str]" = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _ok_lines(output: str) -> List[str]:
    return re.findall(r"^rank \d+ on \S+ ok \S+$", output, re.M)


def test_torchrun_job_on_two_hosts(hosts: Hosts) -> None:
    """torchrun --nnodes=2 (c10d rendezvous on h0), two ranks per host:
    broadcast, all_to_all, gather and one-sided reads, bytes checked;
    same-host peers by memory, the others by tcp."""
    torchrun = [PYTHON, str(Path(__file__).parent / "torchrun.py"), "--nnodes=2",
                "--nproc_per_node=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h0:29400",
                "--rdzv_id=rdmabuf-test", "--max_restarts=0", str(JOBS / "torch_job.py")]  # fmt: skip
    procs = [
        host.popen(torchrun, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for host in hosts
    ]
    outputs = _wait_all(procs, 240)
    for host, p, out in zip(hosts, procs, outputs):
        assert p.returncode == 0, f"torchrun on {host.name} failed:\n{out}"
    lines = _ok_lines("\n".join(outputs))
    assert len(lines) == 4, "\n".join(outputs)
    for line in lines:  # two ranks on this host, two on the other
        backends = line.split()[-1].split(",")
        assert sorted(backends) == ["memory", "memory", "tcp", "tcp"], line


def _mpirun(hosts: Hosts, argv: List[str]) -> str:
    """mpirun on h0 with two ranks on each host (its launch agent enters
    the other host as ssh would); its output, after it succeeded."""
    mpirun = [
        "mpirun", "--mca", "plm_rsh_agent", f"{REPO / 'scripts' / 'netns_hosts.py'} ssh",
        "--host", "h0:2,h1:2", "-np", "4", "-x", "PYTHONPATH", *argv,
    ]  # fmt: skip
    env = {**os.environ, **hosts.environment(), "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # fmt: skip
    proc = hosts[0].popen(mpirun, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)  # fmt: skip
    (out,) = _wait_all([proc], 180)
    assert proc.returncode == 0, out
    return out


def test_mpirun_job_on_two_hosts(hosts: Hosts) -> None:
    """rdmabuf.distributed over mpi4py, in an mpirun job across hosts."""
    out = _mpirun(hosts, [PYTHON, str(JOBS / "mpi_job.py")])
    lines = _ok_lines(out)
    assert len(lines) == 4, out
    for line in lines:
        assert sorted(line.split()[-1].split(",")) == ["memory", "memory", "tcp", "tcp"], line


def test_mpi_example_on_two_hosts(hosts: Hosts) -> None:
    """examples/mpi (C++, handles by MPI_Allgatherv) across hosts: each
    rank reads its right neighbour (same host: memory; the next: tcp)."""
    example = BUILD / "examples" / "mpi" / "handles_allgather"
    if not example.exists():
        if os.environ.get("RDMABUF_TEST_STRICT") == "1":
            raise RuntimeError(f"RDMABUF_TEST_STRICT=1 and {example} was not built (no MPI)")
        pytest.skip(f"{example} was not built (no MPI)")
    out = _mpirun(hosts, [str(example)])
    found = sorted(re.findall(r"^rank (\d) ok \((\w+)\)$", out, re.M))
    assert found == [("0", "memory"), ("1", "tcp"), ("2", "memory"), ("3", "tcp")], out


def _serve(host, size: int) -> subprocess.Popen:
    """`rdmabuf serve` on `host`, listening on its address; its handle is
    the first line of its stdout."""
    env = {**os.environ, "RDMABUF_LISTEN": "0.0.0.0:0"}
    return host.popen([TOOL, "serve", "--size", str(size)], env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip


@pytest.mark.parametrize("hosts", [3], indirect=True)
def test_a_host_removed_mid_transfer_fails_its_ops_alone(hosts: Hosts) -> None:
    """h0 reads 64 MiB from h1 and h2 over and over; h1 dies (unplugged,
    then its processes killed: no reset reaches h0). h0's read from h1
    fails with Unavailable well within its 20 s timeout (the stream's stall
    timeout, 2 s here), nothing hangs, and the reads from h2 go on."""
    size = 64 << 20
    owners = [_serve(hosts[1], size), _serve(hosts[2], size)]
    try:
        handles = [p.stdout.readline().strip() for p in owners]
        assert all(handles), "rdmabuf serve printed no handle"
        env = {**os.environ, "RDMABUF_IO_STALL_TIMEOUT_MS": "2000"}
        reader = hosts[0].popen(
            [PYTHON, str(JOBS / "reader_job.py"), str(size), "5", f"h1={handles[0]}",
             f"h2={handles[1]}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        output = _lines(reader.stdout)
        seen: List[str] = []
        while sum(line == "h1 ok" for line in seen) < 3:  # both owners are being read
            line = output.get(timeout=60)
            assert line, "the reader ended early:\n" + "\n".join(seen)
            seen.append(line.strip())
        removed_at = time.monotonic()
        hosts[1].remove()
        try:
            reader.wait(timeout=60)
        except subprocess.TimeoutExpired:
            reader.kill()
            pytest.fail("the reader hung after h1 was removed:\n" + "\n".join(seen))
        took = time.monotonic() - removed_at
        lines = seen
        while (line := output.get(timeout=10)) != "":
            lines.append(line.strip())
        assert reader.returncode == 0, "\n".join(lines)
        failures = [line for line in lines if line.startswith("h1 failed")]
        assert len(failures) == 1, "\n".join(lines)
        words = failures[0].split()
        assert words[2] == "UnavailableError", failures[0]
        assert float(words[3]) < 15, f"the failure took {words[3]} s: {failures[0]}"
        after = lines[lines.index(failures[0]) + 1 :]
        assert after.count("h2 ok") >= 5 and not any("h2 failed" in x for x in lines), lines
        assert took < 30, f"the reader took {took:.0f} s to finish"
    finally:
        for p in owners:
            p.kill()
            p.wait()


def test_the_op_says_why_not_the_memory_transport(hosts: Hosts) -> None:
    """A reader on another host: the owner offers same-host memory, the op
    takes tcp, and its note says why."""
    owner = _serve(hosts[1], 1 << 20)
    try:
        handle = owner.stdout.readline().strip()
        done = hosts[0].run([str(BUILD / "tests" / "rdmabuf_test_reader"), handle, str(1 << 20)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
        assert "status OK" in done.stdout, done.stdout + done.stderr
        assert "backend tcp" in done.stdout, done.stdout
        assert re.search(r"^note memory: the peer is in another PID namespace", done.stdout, re.M)
    finally:
        owner.kill()
        owner.wait()


def test_bench_pattern_runs_every_pattern_across_two_hosts(tmp_path: Path) -> None:
    """`rdmabuf bench --pattern all` (short): four ranks on two hosts of
    its own, every pattern beside gloo, every byte checked (a wrong byte
    fails the run), the figures in its JSON."""
    report = tmp_path / "patterns.json"
    done = subprocess.run(
        [TOOL, "bench", "--pattern", "all", "--sizes", "64K", "--iters", "2", "--procs", "4",
         "--hosts", "2", "--json", str(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 ranks on 2 host(s)" in done.stdout, done.stdout
    results = json.loads(report.read_text())["results"]
    assert [r["pattern"] for r in results] == ["p2p", "fan-in", "fan-out", "all-to-all", "ring"]
    for r in results:
        assert r["hosts"] == 2 and r["size"] == 64 << 10, r
        assert r["rdmabuf"]["warm_gbps"] > 0 and r["gloo"]["warm_gbps"] > 0, r
        assert "tcp" in r["transports"], r
