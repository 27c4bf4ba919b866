"""rdmabuf.distributed in a torch.distributed group of three processes on
this host (tests/hosts runs it across hosts, under torchrun and mpirun)."""

from __future__ import annotations

import socket
from typing import Any, Dict

import needs
import pytest

needs.module("numpy")
needs.module("torch")

import distributed_ranks
import rdmabuf
import rdmabuf.distributed as rd

RANKS = 3


def run_ranks(spawn: Any, scenario: str) -> Dict[int, Any]:
    """Each rank's outcome: what the scenario returned, or what it raised."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = spawn.Queue()
    procs = [
        spawn.Process(target=distributed_ranks.run_rank, args=(r, RANKS, port, scenario, results))
        for r in range(RANKS)
    ]
    for p in procs:
        p.start()
    outcomes = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    return outcomes


def test_every_pattern_moves_the_right_bytes(spawn: Any) -> None:
    outcomes = run_ranks(spawn, "patterns")
    assert outcomes == {0: "memory", 1: "memory", 2: "memory"}, outcomes


def test_ranks_whose_managers_started_at_different_times_agree(spawn: Any) -> None:
    """Making a window is the same collectives on every rank, whether its
    manager already ran or not (else the ranks' all-gathers mismatch)."""
    outcomes = run_ranks(spawn, "one_rank_used_rdmabuf_before")
    assert outcomes == {r: b"abcabc" for r in range(RANKS)}, outcomes


def test_a_bad_argument_on_one_rank_fails_every_rank_and_hangs_none(spawn: Any) -> None:
    for rank, outcome in run_ranks(spawn, "bad_argument_on_one_rank").items():
        assert isinstance(outcome, rdmabuf.InvalidArgumentError), (rank, outcome)
        assert "rank 0: rdmabuf.distributed.gather: rank dst needs an output" in str(outcome)


def test_an_output_that_overlaps_the_window_fails_every_rank(spawn: Any) -> None:
    """Its bytes would be written while the ranks read them."""
    for rank, outcome in run_ranks(spawn, "output_overlaps_the_window").items():
        assert isinstance(outcome, rdmabuf.InvalidArgumentError), (rank, outcome)
        assert "rank 1: rdmabuf.distributed.all_to_all: output overlaps" in str(outcome), outcome


def test_sizes_that_differ_fail_on_every_rank(spawn: Any) -> None:
    for rank, outcome in run_ranks(spawn, "sizes_differ").items():
        assert isinstance(outcome, rdmabuf.InvalidArgumentError), (rank, outcome)
        assert "same number of bytes" in str(outcome)


def test_a_failed_read_raises_on_every_rank(spawn: Any) -> None:
    """The source released its memory: the readers' reads fail, and every
    rank, the source too, raises the same error naming a reader."""
    for rank, outcome in run_ranks(spawn, "source_released").items():
        assert isinstance(outcome, rdmabuf.NotFoundError), (rank, outcome)
        assert "rank 0:" in str(outcome), outcome


def test_loopback_managers_in_a_group_across_hosts_are_refused(spawn: Any) -> None:
    for rank, outcome in run_ranks(spawn, "loopback_across_hosts").items():
        assert isinstance(outcome, rdmabuf.FailedPreconditionError), (rank, outcome)
        assert "RDMABUF_LISTEN" in str(outcome), outcome


def test_without_a_group_it_says_what_to_do() -> None:
    with pytest.raises(rdmabuf.FailedPreconditionError, match="init_process_group"):
        rd.Window(bytearray(8))
