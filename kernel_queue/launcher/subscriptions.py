"""When a kernel may run a request without its output being lost: IOPub subscriptions settled.

A client that was connected to the kernel this one replaced (a restart in place, a resume after
preemption) reconnects its sockets on its own, each at its next reconnect attempt, and its shell
socket may come back before its IOPub one: a request run then has its output published to no
one. The kernel (``kernel.py``) reports every subscription here (ZeroMQ's XPUB, verbose) and runs
an execute_request only once subscriptions have been quiet for ``SETTLE`` seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time

SETTLE = 0.3
"""Seconds without a new IOPub subscription before a request runs. Every client that was
connected when the previous kernel went away retries every 0.1 s (ZeroMQ's default reconnect
interval, which jupyter_client keeps), so all of them are back within this quiet time."""
FIRST_WAIT = 3.0
"""Seconds a request waits at most for a first subscriber (a client may have no IOPub at all);
once that wait ran out, later requests do not wait for one again."""
MOST_WAIT = 5.0
"""Seconds a request waits at most in all, however often new clients subscribe."""


class Subscriptions:
    """The IOPub subscriptions a kernel has seen; thread-safe (reported by the IOPub thread)."""

    def __init__(self, *, settle: float = SETTLE, first_wait: float = FIRST_WAIT) -> None:
        self.settle, self.first_wait = settle, first_wait
        self._first = threading.Event()
        self._last = 0.0  # monotonic time of the latest subscription
        self._lock = threading.Lock()

    def seen(self) -> None:
        """A client subscribed (called on the IOPub thread)."""
        with self._lock:
            self._last = time.monotonic()
        self._first.set()

    def since(self, when: float) -> bool:
        """A client subscribed after ``when`` (``time.monotonic()``)."""
        with self._lock:
            return self._last > when

    def unknowable(self) -> None:
        """This ipykernel reports no subscriptions: never hold a request."""
        self.settle = 0.0
        self._first.set()

    async def settled(self, *, once: bool = True) -> None:
        """Return once some client subscribed and none did for ``settle`` seconds (bounded).
        With ``once``, a wait for a first subscriber that ran out is not waited again."""
        started = time.monotonic()
        if not self._first.is_set():
            await asyncio.to_thread(self._first.wait, self.first_wait)
            if once:
                self._first.set()  # a client without IOPub is held once, not on every request
        while True:
            with self._lock:
                quiet = time.monotonic() - self._last
            left = MOST_WAIT - (time.monotonic() - started)
            if quiet >= self.settle or left <= 0:
                return
            await asyncio.sleep(min(self.settle - quiet, left))
