"""A group's latest status and the streams following it: what every backend's `watch` yields.

Backends keep `status` and `watchers` on their own group records and call `publish` on each
change; `follow` is the body of their `watch` (of a group they know, or of one they do not: gone).
Pure asyncio, no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from kernel_queue.model import GroupPhase, GroupStatus

TERMINAL = (GroupPhase.FINISHED, GroupPhase.FAILED)
GONE = GroupStatus(GroupPhase.FINISHED, message="the kernel is gone", exit_code=0)
"""What following a group the backend does not know yields, once."""


class Followed(Protocol):
    """A backend's record of one group."""

    status: GroupStatus
    watchers: set[asyncio.Queue[GroupStatus]]


def publish(group: Followed, status: GroupStatus) -> None:
    """Make `status` the group's current one and hand it to every follower (if it changed)."""
    if status == group.status:
        return
    group.status = status
    for updates in group.watchers:
        updates.put_nowait(status)


async def follow(group: Followed | None) -> AsyncIterator[GroupStatus]:
    """Yield the current status, then each change, ending after a terminal one; `GONE` alone
    for no group."""
    if group is None:
        yield GONE
        return
    updates: asyncio.Queue[GroupStatus] = asyncio.Queue()
    group.watchers.add(updates)
    try:
        status = group.status
        while True:
            yield status
            if status.phase in TERMINAL:
                return
            status = await updates.get()
    finally:
        group.watchers.discard(updates)
