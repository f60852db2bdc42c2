"""What the kubernetes backend knows of each LocalQueue its kernels wait in: its ClusterQueue
(named in the sentences a waiting kernel's reason says) and its `Active` condition.

One GET of the LocalQueue when a kernel first waits there, then at most one every `REFRESH`
seconds while kernels wait there and their statuses are refreshed; each read serves every kernel
of the queue (the position reader reads the queue's pending Workloads far more often). Reads run
in the backend's tasks; after each one `on_read(namespace, queue)` refreshes that queue's
kernels. A read that fails is logged at debug level and tried again after `REFRESH`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from kernel_queue import errors
from kernel_queue.kube.client.verbs import KubeApi, Resource
from kernel_queue.kube.queueing import reasons

REFRESH = 30.0
"""Seconds between reads of one LocalQueue while kernels wait in it."""

Key = tuple[str, str]


class Spawner(Protocol):
    """Who owns the reading tasks (the backend's `tasks.Tasks`)."""

    closed: bool

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...


class LocalQueues:
    """The LocalQueues read so far, as `reasons.Queue`s."""

    def __init__(
        self,
        *,
        connect: Callable[[], Awaitable[KubeApi]],
        kind: Callable[[KubeApi], Awaitable[Resource]],
        tasks: Spawner,
        on_read: Callable[[str, str], None],
        log: logging.Logger | logging.LoggerAdapter[Any],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect, self._kind, self._tasks, self._on_read = connect, kind, tasks, on_read
        self._log, self._clock = log, clock
        self._known: dict[Key, reasons.Queue] = {}
        self._read_at: dict[Key, float] = {}  # when the last read began
        self._settled: set[Key] = set()  # read once at least (or failed to be)

    def queue(self, namespace: str, name: str) -> reasons.Queue:
        """What is known of the LocalQueue: only its name until it was read."""
        return self._known.get((namespace, name)) or reasons.Queue(name)

    def settled(self, namespace: str, name: str) -> bool:
        """True once a read of the LocalQueue ended, whether or not it told anything."""
        return (namespace, name) in self._settled

    def follow(self, namespace: str, name: str) -> None:
        """Read the LocalQueue unless a read began within `REFRESH` seconds."""
        key, now = (namespace, name), self._clock()
        began = self._read_at.get(key)
        if not name or self._tasks.closed or (began is not None and now - began < REFRESH):
            return
        self._read_at[key] = now
        self._tasks.spawn(self._read(namespace, name), f"local queue {namespace}/{name}")

    async def _read(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        try:
            api = await self._connect()
            found = await api.get(await self._kind(api), namespace, name)
        except errors.KernelQueueError as exc:  # an API error, or no Kueue served
            self._log.debug("LocalQueue %s/%s not read: %s", namespace, name, exc)
        else:
            cluster_queue = str((found.get("spec") or {}).get("clusterQueue") or "")
            active = reasons.local_queue_active(found)
            self._known[key] = reasons.Queue(name, cluster_queue, active)
        self._settled.add(key)
        self._on_read(namespace, name)

    def clear(self) -> None:
        """Forget everything (the backend closed; its tasks were cancelled)."""
        self._known.clear()
        self._read_at.clear()
        self._settled.clear()
