"""The process's default manager, and its configuration.

One manager per process, created on first use from the RDMABUF_* environment
variables (the README's configuration table) and any `configure()` overrides.
A forked child never uses its parent's manager (whose threads it does not
have): it gets its own on first use. The manager shuts down at interpreter
exit, which releases every buffer this process registered.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from . import _rdmabuf
from ._errors import FailedPreconditionError

__all__ = [
    "Config",
    "BackendInfo",
    "configure",
    "config",
    "backends",
    "shutdown",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]


@dataclasses.dataclass(frozen=True)
class Config:
    """The configuration of a manager. Each field is the RDMABUF_* environment
    variable of the same name (lower case, without the prefix); the README's
    configuration table says what each does."""

    listen: str
    advertise_host: str
    backends: Tuple[str, ...]
    allow_tcp_fallback: bool
    tcp_streams: int
    chunk_size: int
    busy_poll_us: int
    timeout_ms: int
    io_stall_timeout_ms: int
    max_connections: int
    io_threads: int
    log_level: str


class BackendInfo(NamedTuple):
    """One transport rdmabuf knows, whether this process can use it, and why not."""

    name: str
    viable: bool
    reason: str


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.manager: Optional[_rdmabuf.Manager] = None
        self.pid = os.getpid()
        self.overrides: Dict[str, Any] = {}
        # get_rdma_backend() of `manager`, once asked (listing backends
        # opens every RDMA device).
        self.rdma_backend: Optional[str] = None


_state = _State()


def _reset_after_fork() -> None:
    # The parent's manager object stays reachable from objects made before
    # the fork; the compiled layer refuses to use it here and leaks it.
    global _state
    overrides = _state.overrides
    _state = _State()
    _state.overrides = overrides


os.register_at_fork(after_in_child=_reset_after_fork)


def default_manager() -> _rdmabuf.Manager:
    """This process's manager, created on first use."""
    state = _state
    manager = state.manager
    if manager is not None and state.pid == os.getpid():
        return manager
    return _create()


def manager_in_use() -> bool:
    """Whether this process's manager exists (configure() is too late)."""
    state = _state
    return state.manager is not None and state.pid == os.getpid()


def _create() -> _rdmabuf.Manager:
    if _state.pid != os.getpid():  # forked without the at-fork hook running
        _reset_after_fork()
    state = _state
    with state.lock:
        if state.manager is None:
            state.manager = _rdmabuf.Manager(dict(state.overrides))
        return state.manager


def configure(**fields: Any) -> Config:
    """Sets configuration fields for this process's manager, before its first use.

    Fields are those of `Config` (e.g. ``backends="tcp"``, ``tcp_streams=4``,
    ``chunk_size="4M"``, ``timeout_ms=5000``) and override the RDMABUF_*
    environment variables; earlier `configure` calls are kept. Returns the
    configuration the manager will use. Raises InvalidArgumentError for a bad
    value, TypeError for an unknown field, and FailedPreconditionError once
    the manager exists (after `shutdown()`, configuring again is allowed).
    """
    state = _state
    with state.lock:
        if state.manager is not None and state.pid == os.getpid():
            raise FailedPreconditionError(
                "rdmabuf is already in use in this process: configure() must come before the "
                "first RDMABuffer or transfer (or call rdmabuf.shutdown() first)"
            )
        merged = dict(state.overrides)
        merged.update(fields)
        result = _rdmabuf.make_config(merged)  # validates
        state.overrides = merged
    return Config(**result)


def config() -> Config:
    """The configuration in effect: the manager's, or, before its first use,
    the one it will be created with (environment plus `configure` overrides)."""
    state = _state
    manager = state.manager
    if manager is not None and state.pid == os.getpid():
        return Config(**manager.config())
    return Config(**_rdmabuf.make_config(dict(state.overrides)))


def backends() -> List[BackendInfo]:
    """Every transport rdmabuf knows, in priority order, with whether this
    process's manager can use it and, if not, why (creates the manager)."""
    return [
        BackendInfo(name, viable, reason)
        for name, _level, viable, reason, _details in default_manager().backends()
    ]


def get_rdma_backend() -> str:
    """The transport this process offers peers on other hosts, as Monarch
    names it: "ibverbs" when an RDMA device is usable, else "tcp" (unless
    TCP fallback is disabled), else "none". Same-host peers use shared
    memory whatever this says. Creates the manager; cached for its life."""
    state = _state
    manager = default_manager()
    cached = state.rdma_backend
    if cached is not None and state.manager is manager:
        return cached
    viable = {name for name, _level, ok, _reason, _details in manager.backends() if ok}
    if "ibverbs" in viable:
        result = "ibverbs"
    elif "tcp" in viable and manager.config()["allow_tcp_fallback"]:
        result = "tcp"
    else:
        result = "none"
    if state.manager is manager:
        state.rdma_backend = result
    return result


def is_ibverbs_available() -> bool:
    """True when this process can move bytes with RDMA (an ibverbs device is
    usable); creates the manager."""
    return get_rdma_backend() == "ibverbs"


def is_rdma_available() -> bool:
    """True when RDMABuffer can reach peers on other hosts at all: over
    ibverbs, or over TCP where the fallback is allowed (Monarch's meaning);
    creates the manager."""
    return get_rdma_backend() != "none"


def shutdown() -> None:
    """Shuts this process's manager down: fails transfers in flight with
    CancelledError, stops serving peers and releases every buffer this
    process registered (their handles fail with NotFoundError or
    UnavailableError from then on). The next use creates a new manager.
    Runs at interpreter exit on its own."""
    state = _state
    with state.lock:
        manager, state.manager = state.manager, None
    if manager is not None and manager.in_this_process:
        manager.shutdown()


atexit.register(shutdown)
