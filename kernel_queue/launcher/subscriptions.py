"""When a kernel may run a request without its output being lost: IOPub subscriptions settled.

A client that was connected to the kernel this one replaced (a restart in place, a resume after
preemption or a wake) reconnects its sockets on its own, and its shell socket may come back
before its IOPub one: a request run then has its output published to no one. The kernel
(``kernel.py``) reports every subscription here (ZeroMQ's XPUB, verbose) and runs an
execute_request only once subscriptions have been quiet for ``SETTLE`` seconds.

A blocking client (``BlockingKernelClient``, ``jupyter console``) is later still: ZeroMQ sends a
SUB socket's subscription again only when its owner next polls that socket, which such a client
does only once it has sent a request and reads its output. So a client's first request in this
kernel process that is not preceded by anything else of its session (a new client says
``kernel_info`` first) waits up to ``LATE_WAIT`` for a subscription that follows it
(``late``).
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
LATE_WAIT = 1.0
"""Seconds a client's first request waits for the subscription a blocking client sends only
once it polls its IOPub socket: at once after sending for ``execute_interactive``, within 50 ms
for ``jupyter console`` (0.25 s lost a first cell's busy status 1 time in 40 on a loaded
two-core machine, 0.5 s once in 40 in a whole-suite CI run). The wait ends at the
subscription, so only a client that has no IOPub pays it, once per kernel process."""
_SESSIONS_KEPT = 10_000
"""Client sessions remembered (``opens_session``); the oldest are forgotten past this many."""


class Subscriptions:
    """The IOPub subscriptions a kernel has seen; thread-safe (reported by the IOPub thread)."""

    def __init__(self, *, settle: float = SETTLE, first_wait: float = FIRST_WAIT) -> None:
        self.settle, self.first_wait = settle, first_wait
        self._first = threading.Event()
        self._last = 0.0  # monotonic time of the latest subscription
        self._lock = threading.Condition()  # notified at each subscription
        self._openers: dict[str, str] = {}  # client session -> id of its first shell message
        self._known = True  # subscriptions are reported (``unknowable``)
        self._busy = ("", 0.0)  # the shell request ipykernel said `busy` for last, and when

    def seen(self) -> None:
        """A client subscribed (called on the IOPub thread)."""
        with self._lock:
            self._last = time.monotonic()
            self._lock.notify_all()
        self._first.set()

    def busy(self, msg_id: str) -> None:
        """ipykernel is about to say `busy` for shell request `msg_id` (on the shell thread)."""
        with self._lock:
            self._busy = (msg_id, time.monotonic())

    def asked(self, msg_id: str) -> float:
        """When request `msg_id`'s output began: just before its `busy` was said, else now. A
        client that subscribed after that missed the `busy`, even if it subscribed before the
        request's handler ran (a loaded machine may run other threads between the two)."""
        with self._lock:
            said, when = self._busy
        return when if msg_id and said == msg_id else time.monotonic()

    def since(self, when: float) -> bool:
        """A client subscribed after ``when`` (``time.monotonic()``)."""
        with self._lock:
            return self._last > when

    def unknowable(self) -> None:
        """This ipykernel reports no subscriptions: never hold a request."""
        self.settle = 0.0
        self._known = False
        self._first.set()

    def message(self, session: str, msg_id: str) -> None:
        """A shell message of client `session` arrived (called for every one, in order)."""
        if session and session not in self._openers:
            if len(self._openers) >= _SESSIONS_KEPT:
                del self._openers[next(iter(self._openers))]
            self._openers[session] = msg_id

    def opens_session(self, session: str, msg_id: str) -> bool:
        """Message `msg_id` was the first this process got from client `session`."""
        return bool(session) and self._openers.get(session) == msg_id

    async def late(self, asked: float, *, within: float = LATE_WAIT) -> None:
        """Return once a client subscribed after ``asked`` (``time.monotonic()``), or after
        `within` s: the wait for a blocking client that was connected to the kernel this one
        replaced, which subscribes again only once it polls for its request's output."""
        if self._known:
            await asyncio.to_thread(self._wait_since, asked, within)

    def _wait_since(self, asked: float, within: float) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self._last > asked, timeout=within)

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
