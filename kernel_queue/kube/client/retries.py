"""Bounded retries of idempotent API calls: exponential backoff that honours `Retry-After`.

`Backoff` is the policy (first and largest pause, and a budget of pause seconds after which the
last error is raised); `retry` runs one call under it. Only `ClusterUnavailable` (429, 5xx, a
timeout, a refused connection) is retried: every other answer is the call's result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kernel_queue import errors

log = logging.getLogger(__name__)

T = TypeVar("T")

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Backoff:
    """Pause `first` seconds after the first failure, doubling up to `largest`; a `Retry-After`
    the server sent wins (up to `largest`). Stop once the pauses would pass `budget` seconds.
    `sleep` is asyncio's (tests pass a recorder)."""

    first: float = 0.2
    largest: float = 5.0
    budget: float = 30.0
    sleep: Sleep = field(default=asyncio.sleep, compare=False)

    def delays(self) -> list[float]:
        """The planned pauses without `Retry-After`: what a call that always fails waits."""
        planned, delay, total = [], self.first, 0.0
        while total + delay <= self.budget:
            planned.append(delay)
            total += delay
            delay = min(delay * 2, self.largest)
        return planned


NEVER = Backoff(budget=0.0)
"""No retry: the first answer is final."""


def retry_after(exc: errors.ClusterApiError) -> float | None:
    """The seconds the server asked to wait (its `Retry-After`), if it said so."""
    seconds = getattr(exc, "retry_after", None)
    return float(seconds) if isinstance(seconds, int | float) and seconds >= 0 else None


async def retry(call: Callable[[], Awaitable[T]], policy: Backoff) -> T:
    """`await call()`; on `ClusterUnavailable` pause and call again, within `policy`'s budget.
    The error of the last attempt is raised when the budget is spent."""
    delay, spent = policy.first, 0.0
    while True:
        try:
            return await call()
        except errors.ClusterUnavailable as exc:
            asked = retry_after(exc)
            pause = min(asked if asked is not None else delay, policy.largest)
            if spent + pause > policy.budget:
                raise
            log.debug("%s; retrying in %.1f s", exc, pause)
            await policy.sleep(pause)
            spent += pause
            delay = min(delay * 2, policy.largest)
