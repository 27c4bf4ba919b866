"""Future: the result of a transfer, awaitable from asyncio or waited on with get().

A transfer starts when `read_into`, `write_from` or `RDMAAction.submit`
returns its Future; awaiting or calling get() only waits for it.

How awaiting works without spinning: a transfer started while an event loop
runs in the calling thread gets a completion callback. It runs on a library
thread, never takes the GIL, and pushes a token into a queue whose eventfd
the event loop watches (`loop.add_reader`, one per loop); the loop thread
drains the queue and resolves the asyncio futures of the tasks awaiting.
get() instead releases the GIL and blocks in the library. A transfer started
from synchronous code gets no callback (it costs the manager a thread
wake-up per transfer); if it is awaited after all, an executor thread waits
for it, the GIL released.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from typing import Any, Dict, Generator, Generic, Optional, Tuple, TypeVar

from . import _rdmabuf

__all__ = ["Future"]

T = TypeVar("T")


class _LoopWaker:
    """Completions of transfers awaited on one event loop."""

    __slots__ = ("notifier", "waiters", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.notifier = _rdmabuf.Notifier()
        self.waiters: Dict[int, asyncio.Future[None]] = {}
        loop.add_reader(self.notifier.fd, self._ready)

    def _ready(self) -> None:
        waiters = self.waiters
        for token in self.notifier.drain():
            fut = waiters.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(None)


_wakers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker]" = (
    weakref.WeakKeyDictionary()
)
_tokens = itertools.count(1)

# What Transfer.attach answers (PyTransfer::Attach).
_DONE, _ATTACHED, _NO_CALLBACK = 0, 1, 2


def notify() -> bool:
    """Whether a transfer started now should get a completion callback: when
    an event loop runs in this thread, its future will most likely be
    awaited. Otherwise it is started as a plain transfer, the cheapest to
    wait on with get()."""
    return asyncio._get_running_loop() is not None


# The waker used last (the loop held weakly), to skip the weak dictionary
# on the common path.
_last: "Tuple[Optional[weakref.ref[asyncio.AbstractEventLoop]], Optional[_LoopWaker]]" = (
    None,
    None,
)


def _waker(loop: asyncio.AbstractEventLoop) -> _LoopWaker:
    global _last
    last_loop, waker = _last
    if last_loop is not None and last_loop() is loop and waker is not None:
        return waker
    waker = _wakers.get(loop)
    if waker is None:
        waker = _wakers[loop] = _LoopWaker(loop)
    _last = (weakref.ref(loop), waker)
    return waker


class Future(Generic[T]):
    """The outcome of a transfer in flight: ``await fut`` or ``fut.get()``.

    Both return the value (bytes moved for read_into/write_from, None for an
    RDMAAction or drop) or raise the transfer's `rdmabuf.Error`. The future
    holds the transfer's local memory (tensor, array, ...) until the transfer
    is done. Dropping an unfinished future cancels its transfer: once it is
    gone, rdmabuf no longer touches that memory. Cancelling an asyncio task
    that awaits it cancels the transfer too.

    The transfer's timeout is enforced while anyone waits (get, await,
    done); one started while an event loop runs in the thread also fails at
    its deadline when nobody waits.
    """

    __slots__ = ("_t",)

    def __init__(self, transfer: Any) -> None:
        self._t = transfer

    def done(self) -> bool:
        """True when the transfer has finished (successfully or not)."""
        return bool(self._t.done())

    def get(self, timeout: Optional[float] = None) -> T:
        """Blocks until the transfer finishes (the GIL is released meanwhile) and
        returns its value or raises its error. `timeout` (seconds) bounds this
        wait only: when it passes first, TimeoutError is raised and the
        transfer goes on under its own timeout."""
        return self._t.wait_result(timeout)  # type: ignore[no-any-return]

    # Familiar to concurrent.futures users.
    result = get

    def cancel(self) -> bool:
        """Cancels the transfer if unfinished (its ops fail with CancelledError).
        Returns once rdmabuf no longer touches the local memory. True when the
        transfer had not finished."""
        if self._t.done():
            return False
        self._t.cancel()
        return True

    def __await__(self) -> Generator[Any, None, T]:
        t = self._t
        if not t.done():
            loop = asyncio.get_running_loop()
            waker = _waker(loop)
            fut: asyncio.Future[Any] = loop.create_future()
            token = next(_tokens)
            waker.waiters[token] = fut
            attached = t.attach(waker.notifier, token)
            if attached != _ATTACHED:
                del waker.waiters[token]
            if attached == _NO_CALLBACK:
                # Started where no event loop ran (so without a completion
                # callback): wait in an executor thread, GIL released.
                fut = loop.run_in_executor(None, t.wait, None)
            if attached != _DONE:
                try:
                    yield from fut
                except BaseException:
                    # The awaiting task was cancelled (or the loop torn down):
                    # stop the transfer so its memory is free when we return.
                    waker.waiters.pop(token, None)
                    t.cancel()
                    raise
        return t.result()  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<rdmabuf.Future {'done' if self.done() else 'pending'}>"


class _Done:
    """A finished transfer with a fixed result, for operations that complete
    at once (drop)."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def done(self) -> bool:
        return True

    def wait_result(self, timeout: Optional[float] = None) -> Any:
        return self._value

    def result(self) -> Any:
        return self._value

    def cancel(self) -> None:
        pass

    def attach(self, notifier: Any, token: int) -> int:
        return _DONE


def completed(value: T) -> Future[T]:
    """A Future that is already done with `value`."""
    return Future(_Done(value))
