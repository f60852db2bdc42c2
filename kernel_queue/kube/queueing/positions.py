"""Queue positions from Kueue's visibility API: one reader per LocalQueue serves all its kernels.

`read_places` pages through a LocalQueue's pending Workloads (``offset``, ``limit``: Kueue
answers at most ``limit`` of them, 1000 by default) until the queue's end, so every waiting
Workload gets its place whatever the queue's length; the requests grow with the pages, never
with the kernels. When the visibility API is unavailable (or not served) it falls back to the
LocalQueue's pending count for every kernel, and says so in the log once until it answers again
(`Warned`). `Readers` runs one reading task per LocalQueue, only while kernels wait there, in
tasks the backend owns; after a read of N pages it waits N reading intervals, so one LocalQueue
costs at most one request per interval on average, however long it is. Only a group whose place
changed is told (a status refresh each), in batches between which the event loop runs. The
Workloads that were pending at one whole read and are not at the next have left the queue
(admitted, mostly): `left(namespace, queue, names)` is told, so the wait estimate counts the
admissions of every server's kernels without watching their Workloads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernel_queue import errors
from kernel_queue.kube.client.verbs import KubeApi
from kernel_queue.kube.objects import preflight
from kernel_queue.kube.queueing import kueue_versions
from kernel_queue.kube.queueing.kueue_versions import KueueVersions
from kernel_queue.model import QueuePlace

PAGE = 1000
"""Pending Workloads per page: Kueue's own default ``limit``, so one answer stays a few hundred
KB, decoded on the event loop between other work, at any queue length."""


BATCH = 100
"""Groups given their place between two yields to the event loop (each is a status refresh)."""
_UNTOLD = QueuePlace("", -1, -1)  # no group was given this place


class Warned:
    """The queues whose visibility failure was logged, so each outage is logged once."""

    def __init__(self) -> None:
        self.queues: set[tuple[str, str]] = set()


@dataclass
class Places:
    """One read of a LocalQueue: each pending Workload's place (`found`), or, when the
    visibility API gave none, only the queue's length (`everyone`); `pages` requests it took."""

    found: dict[str, QueuePlace] = field(default_factory=dict)
    everyone: QueuePlace | None = None
    pages: int = 1

    def of(self, name: str) -> QueuePlace | None:
        """The Workload's place, the queue's length alone, or None (not pending there)."""
        return self.found.get(name, self.everyone)


async def read_places(
    api: KubeApi,
    namespace: str,
    queue: str,
    *,
    served: KueueVersions,
    warned: Warned,
    log: logging.Logger | logging.LoggerAdapter[Any],
    page: int = PAGE,
) -> Places:
    """Every pending Workload's place in `queue`, read page by page; the count alone as a
    fallback."""
    key = (namespace, queue)
    path = served.pending_workloads_path(namespace, queue)
    problem = "the cluster serves no visibility API kernel-queue speaks"
    if path is not None:
        try:
            places = await _pages(api, path, queue, page)
        except errors.ClusterApiError as exc:
            problem = str(exc)
        else:
            if key in warned.queues:
                warned.queues.discard(key)
                log.info("queue positions of %s/%s are available again", *key)
            return places
    if key not in warned.queues:
        warned.queues.add(key)
        log.warning(
            "queue positions of %s/%s unavailable (%s); showing the queue's length", *key, problem
        )
    try:
        found = await api.get(served.local_queues, namespace, queue)
    except errors.ClusterApiError:
        return Places()
    count = kueue_versions.local_queue(found, served.kueue).pending
    return Places(everyone=QueuePlace(queue, 0, count) if count else None)


async def _pages(api: KubeApi, path: str, queue: str, page: int) -> Places:
    """Read `path` from offset 0 until a page ends the queue. Each request asks for one item
    more than a page: when it comes, the queue goes on (and that item is read again as the next
    page's first, so one Workload leaving the queue between two reads shifts none past us);
    when it does not, this page was the last, and no empty page is read after a full one."""
    positions: dict[str, int] = {}
    offset, pages = 0, 0
    while True:
        summary = await api.get_path(path, {"offset": str(offset), "limit": str(page + 1)})
        pages += 1
        items = summary.get("items") or []
        for index, item in enumerate(items):
            name = (item.get("metadata") or {}).get("name")
            if name:
                positions[str(name)] = int(item.get("positionInLocalQueue", offset + index))
        if len(items) <= page:
            length = offset + len(items)
            break
        offset += page
    length = max(length, len(positions))
    found = {name: QueuePlace(queue, at + 1, length) for name, at in positions.items()}
    return Places(found, pages=pages)


class Spawner(Protocol):
    """Who owns the reader tasks (the backend's `tasks.Tasks`)."""

    closed: bool

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...


class Readers:
    """One reader task per LocalQueue where kernels wait: it reads the queue's places, hands
    each waiting group its own (`place(name, place)`) and waits `interval()` seconds per page it
    read, until `waiting(namespace, queue)` names no group; the next kernel to wait there starts
    another. The Kueue versions come from the connection's `discovery`; `page` and `sleep` are
    Kueue's page size and asyncio's sleep unless a test says otherwise."""

    def __init__(
        self,
        *,
        connect: Callable[[], Awaitable[KubeApi]],
        tasks: Spawner,
        waiting: Callable[[str, str], list[str]],
        place: Callable[[str, QueuePlace | None], None],
        interval: Callable[[], float],
        log: logging.Logger | logging.LoggerAdapter[Any],
        discovery: preflight.Discovery | None = None,
        page: int = PAGE,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        left: Callable[[str, str, set[str]], None] = lambda namespace, queue, names: None,
    ) -> None:
        self._connect, self._tasks, self._log, self._left = connect, tasks, log, left
        self._waiting, self._place, self._interval = waiting, place, interval
        self._discovery = discovery or preflight.Discovery()
        self.page, self._sleep = page, sleep
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
        told: dict[str, QueuePlace | None] = {}  # the place each waiting group was last given
        pending: set[str] | None = None  # the queue's Workloads at the last whole read
        while True:
            waiting = self._waiting(namespace, queue)
            if not waiting:
                return
            told = {name: told[name] for name in waiting if name in told}
            pages = 1
            try:
                served = await self._discovery.versions(api)
            except (errors.ClusterApiError, errors.KueueNotInstalled) as exc:
                self._log.debug("no queue positions of %s/%s yet: %s", namespace, queue, exc)
            else:
                places = await read_places(
                    api,
                    namespace,
                    queue,
                    served=served,
                    warned=self._warned,
                    log=self._log,
                    page=self.page,
                )
                pages = places.pages
                # A Workload missing from a read of several pages may have moved across a page
                # boundary while they were read: it keeps its last place until the next read.
                whole = places.pages == 1 or places.everyone is not None
                if places.everyone is None and whole:
                    if pending is not None and pending - places.found.keys():
                        self._left(namespace, queue, pending - places.found.keys())
                    pending = set(places.found)
                changed = [
                    (name, place)
                    for name in waiting
                    if (name in places.found or whole)
                    and told.get(name, _UNTOLD) != (place := places.of(name))
                ]
                for done, (name, place) in enumerate(changed, 1):
                    told[name] = place
                    self._place(name, place)
                    if done % BATCH == 0:
                        await asyncio.sleep(0)  # thousands of kernels: let the loop breathe
            await self._sleep(self._interval() * pages)
