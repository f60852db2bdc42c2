"""Queue positions from Kueue's visibility API: one read per LocalQueue serves all its kernels.

`read_places` returns Workload name -> `QueuePlace`; when the visibility API is unavailable it
falls back to the LocalQueue's pending count for every kernel (key ""), and says so in the log
once until it answers again (`Warned`). `Readers` runs one reading task per LocalQueue, only
while kernels wait there, in tasks the backend owns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from kernel_queue import errors
from kernel_queue.kube import kueue
from kernel_queue.kube.verbs import KubeApi
from kernel_queue.model import QueuePlace


class Warned:
    """The queues whose visibility failure was logged, so each outage is logged once."""

    def __init__(self) -> None:
        self.queues: set[tuple[str, str]] = set()


async def read_places(
    api: KubeApi,
    namespace: str,
    queue: str,
    *,
    warned: Warned,
    log: logging.Logger | logging.LoggerAdapter[Any],
) -> dict[str, QueuePlace]:
    """Workload name -> place in `queue`; {"": place} with only the count as a fallback."""
    key = (namespace, queue)
    try:
        summary = await api.get_path(kueue.pending_workloads_path(namespace, queue))
    except errors.ClusterApiError as exc:
        if key not in warned.queues:
            warned.queues.add(key)
            log.warning(
                "queue positions of %s/%s unavailable (%s); showing the queue's length", *key, exc
            )
        try:
            local_queue = await api.get(kueue.LOCAL_QUEUES, namespace, queue)
        except errors.ClusterApiError:
            return {}
        count = int((local_queue.get("status") or {}).get("pendingWorkloads") or 0)
        return {"": QueuePlace(queue, 0, count)} if count else {}
    if key in warned.queues:
        warned.queues.discard(key)
        log.info("queue positions of %s/%s are available again", *key)
    items = summary.get("items") or []
    return {
        item["metadata"]["name"]: QueuePlace(
            queue, int(item.get("positionInLocalQueue", index)) + 1, len(items)
        )
        for index, item in enumerate(items)
    }


class Spawner(Protocol):
    """Who owns the reader tasks (the backend's `tasks.Tasks`)."""

    closed: bool

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...


class Readers:
    """One reader task per LocalQueue where kernels wait: it reads the queue's places every
    `interval()` seconds and hands each waiting group its own (`place(name, place)`), until
    `waiting(namespace, queue)` names no group; the next kernel to wait there starts another."""

    def __init__(
        self,
        *,
        connect: Callable[[], Awaitable[KubeApi]],
        tasks: Spawner,
        waiting: Callable[[str, str], list[str]],
        place: Callable[[str, QueuePlace | None], None],
        interval: Callable[[], float],
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self._connect, self._tasks, self._log = connect, tasks, log
        self._waiting, self._place, self._interval = waiting, place, interval
        self._readers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._warned = Warned()

    def follow(self, namespace: str, queue: str) -> None:
        """Make sure a reader of `queue` runs (not once the tasks are closed)."""
        key = (namespace, queue)
        task = self._readers.get(key)
        if queue and (task is None or task.done()) and not self._tasks.closed:
            self._readers[key] = self._tasks.spawn(
                self._read(namespace, queue), f"positions {namespace}/{queue}"
            )

    def clear(self) -> None:
        """Forget the readers (their owner cancelled them)."""
        self._readers.clear()

    async def _read(self, namespace: str, queue: str) -> None:
        """Read the LocalQueue's pending Workloads while any of our kernels waits there."""
        api = await self._connect()
        while True:
            waiting = self._waiting(namespace, queue)
            if not waiting:
                return
            places = await read_places(api, namespace, queue, warned=self._warned, log=self._log)
            for name in waiting:
                self._place(name, places.get(name, places.get("")))
            await asyncio.sleep(self._interval())
