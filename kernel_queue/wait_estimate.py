"""How long a waiting kernel may still wait, from the admissions seen in its queue (pure).

A backend records each admission it observes in a queue (`Admissions.observe`, no extra API
traffic: the kubernetes backend reads them off the Workloads its informer already holds, the
local backend off its own decisions); `estimate` turns them into seconds for a position and
`words` into what the user reads. No I/O; callers pass the clock.

Rules:
- Window: the admissions of the last `WINDOW` seconds (30 min), at most the `KEPT` (20) newest;
  one stamped ahead of `now` (another machine's clock) counts as now.
- Enough data: at least `MIN_SAMPLES` (3) admissions in the window; else no estimate (None).
- Rate: (admissions - 1) / (now - the oldest of them), the span at least `MIN_SPAN` (60 s), so a
  burst of admissions (a queue just opened) does not promise seconds, and a queue that stopped
  admitting slows its own rate as time passes without another admission.
- Estimate for position N (1 = next): N / rate. Unknown position (0): no estimate.
- Words: under a minute in tens of seconds, rounded up ("about 40 s"); under an hour in whole
  minutes ("about 4 min"); under a day in whole hours ("about 2 h"); else "more than a day".
  `describe` adds "at the recent rate", so it reads as the estimate it is. `estimate` returns
  the seconds those words say (`rounded`), so a waiting kernel's status changes only when the
  words do, not on every refresh of its queue.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Sequence

WINDOW = 30 * 60.0
"""Seconds of admissions the rate is taken from."""
KEPT = 20
"""The newest admissions kept per queue."""
MIN_SAMPLES = 3
"""Admissions in the window before anything is estimated."""
MIN_SPAN = 60.0
"""The shortest span (s) a rate is taken over."""


def rate(times: Sequence[float], *, now: float) -> float | None:
    """Admissions per second in the window before `now`; None with too few of them."""
    # A time ahead of `now` (the clock that stamped it runs ahead of ours) counts as now.
    recent = sorted(min(t, now) for t in times if now - WINDOW <= t)[-KEPT:]
    if len(recent) < MIN_SAMPLES:
        return None
    return (len(recent) - 1) / max(now - recent[0], MIN_SPAN)


def estimate(times: Sequence[float], *, now: float, position: int) -> float | None:
    """Seconds until the kernel at 1-based `position` is admitted at the recent rate, `rounded`
    as the user reads them, or None (too few admissions, or the position unknown)."""
    per_second = rate(times, now=now)
    if per_second is None or position < 1:
        return None
    return rounded(position / per_second)


def rounded(seconds: float) -> float:
    """`seconds` as `words` says them (240.0 for "about 4 min"; a day for more than a day), so
    an estimate changes only when its words do."""
    if seconds < 60:
        tens = max(1, math.ceil(seconds / 10))
        if tens < 6:
            return tens * 10.0
    minutes = max(1, round(seconds / 60))
    if minutes < 60:
        return minutes * 60.0
    return min(round(seconds / 3600), 24) * 3600.0


def words(seconds: float) -> str:
    """ "about 40 s", "about 4 min", "about 2 h", or "more than a day"."""
    shown = rounded(seconds)
    if shown < 60:
        return f"about {shown:.0f} s"
    if shown < 3600:
        return f"about {shown / 60:.0f} min"
    if shown < 24 * 3600:
        return f"about {shown / 3600:.0f} h"
    return "more than a day"


def describe(seconds: float | None) -> str:
    """The clause of the kernel's reason: "about 4 min at the recent rate", or ""."""
    return "" if seconds is None else f"{words(seconds)} at the recent rate"


class Admissions:
    """The admissions observed per queue: (key, time) pairs, the `KEPT` newest of each queue.

    `key` names one admission (a Workload and the time Kueue admitted it, say), so seeing the
    same admission again, as every later change of that Workload shows it, counts it once."""

    def __init__(self) -> None:
        self._queues: dict[Hashable, list[tuple[float, Hashable]]] = {}

    def observe(self, queue: Hashable, key: Hashable, at: float) -> None:
        """Note an admission in `queue` at `at` (seconds, the clock `times` is read against)."""
        seen = self._queues.setdefault(queue, [])
        if any(k == key for _, k in seen):
            return
        bisect.insort(seen, (at, key), key=lambda pair: pair[0])  # a relist comes in any order
        del seen[:-KEPT]

    def times(self, queue: Hashable) -> list[float]:
        """The kept admission times of `queue`, oldest first."""
        return [at for at, _ in self._queues.get(queue, ())]

    def estimate(self, queue: Hashable, *, now: float, position: int) -> float | None:
        """`estimate` over the admissions of `queue`."""
        return estimate(self.times(queue), now=now, position=position)
