"""The background tasks a backend starts, owned in one place: none is left pending or unread.

`Tasks.spawn` names each task and keeps it until it ends; a task that fails is logged once
(the work itself logs what it expects, this catches the rest); `aclose` cancels every task and
waits for them, so none is destroyed pending when the loop closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

PREFIX = "kernel-queue: "
"""Every task's name starts so (tests find what a backend left running by it)."""


class Tasks:
    """A set of running tasks, each logged to `log` if it fails."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self.log = log
        self._running: set[asyncio.Task[Any]] = set()
        self.closed = False

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `work` in a task named `kernel-queue: <name>`, owned until it ends (also after
        `aclose`: a closed backend may still end its groups)."""
        task = asyncio.get_running_loop().create_task(work, name=PREFIX + name)
        self._running.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.error("%s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._running)

    async def aclose(self) -> None:
        """Cancel every task and wait until each has ended; `closed` is True from now on."""
        self.closed = True
        while self._running:
            running = list(self._running)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
