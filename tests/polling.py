"""The tests' one way to wait for what no event marks: poll a condition until it holds.

State that lives in another process (a kernel, a gateway, the fake cluster's store, a server's REST
API) has nothing a test can await, so a test polls it. Every poll is bounded, and a poll that runs
out fails with `NeverSaw`: what never happened and the last value seen (or the `detail` asked
for), never a bare TimeoutError. Waits that do have an event (a session's change, a followed
group's status) await it instead.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

WITHIN = 60.0
"""Long enough for a real kernel to start on a loaded 2-core machine; a pass returns at once."""
EVERY = 0.05


class NeverSaw(AssertionError):
    """A poll ran out: the message says what never happened and what was seen instead."""


def _shown(value: object) -> str:
    seen = value if isinstance(value, str) else repr(value)
    return seen if len(seen) <= 500 else seen[:500] + "..."


async def until(
    check: Callable[[], T | Awaitable[T]],
    what: str,
    *,
    within: float = WITHIN,
    every: float = EVERY,
    detail: Callable[[], object] | None = None,
) -> T:
    """Call `check` (plain or async) every `every` s until it returns something truthy; return it.

    `every=0` only lets the loop's other tasks run between calls (for a task in this process).
    `detail` (plain or async) says what the failure shows instead of the last value seen.
    """
    last: object = None
    try:
        async with asyncio.timeout(within):  # bounds a check that hangs, too
            while True:
                result = check()
                value = await result if inspect.isawaitable(result) else result
                if value:
                    return value
                last = value
                await asyncio.sleep(every)
    except TimeoutError:
        pass
    if detail is not None:
        shown = detail()
        last = await shown if inspect.isawaitable(shown) else shown
        raise NeverSaw(f"never saw {what} within {within:g} s: {_shown(last)}")
    raise NeverSaw(f"never saw {what} within {within:g} s (last seen: {_shown(last)})")


def until_sync(
    check: Callable[[], T],
    what: str,
    *,
    within: float = WITHIN,
    every: float = EVERY,
    detail: Callable[[], object] | None = None,
) -> T:
    """`until` for a test without an event loop: the same bound, the same failure."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            if detail is not None:
                raise NeverSaw(f"never saw {what} within {within:g} s: {_shown(detail())}")
            raise NeverSaw(f"never saw {what} within {within:g} s (last seen: {_shown(value)})")
        time.sleep(every)
