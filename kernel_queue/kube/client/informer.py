"""`Informer`: one shared list+watch of a kind in a namespace, cached in memory for every kernel.

An informer lists once, then watches from the list's resourceVersion in one background task,
keeps the objects in a dict (each first passed through its `transform`, as client-go's
SetTransform, so the cache holds only what its readers need) and calls its handlers on every
change; after a 410 it relists and reports what changed while it was away. Readers never cause
an API call. `Informers` hands out one started informer per (api, kind, namespace, selector):
never a watch per kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from logging import DEBUG, WARNING
from typing import Any

from kernel_queue import errors
from kernel_queue.kube.client.verbs import KubeApi, Resource

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Handler = Callable[[str, Obj, Obj | None], None]
"""`handler(event_type, obj, old)`: "ADDED" (old None), "MODIFIED" or "DELETED" (old: the
cached object before the change), both as cached (transformed). Called on the event loop; it
must not block."""
Transform = Callable[[Obj], Obj]
"""What the cache keeps of an object the API server sent (a new object or the same one)."""

BURST = 100
"""Events applied in a row before the event loop runs other work: a burst of thousands (Kueue
updating every pending Workload at once) reads from the stream's buffer without a pause."""
DEFAULT_BACKOFF = (0.1, 10.0)
"""First and largest pause (s) between attempts after errors; doubles on each failure."""


class Informer:
    """The cached objects of one `kind` in `namespace` (None: all namespaces, or a cluster-scoped
    kind) matching `label_selector`, kept current by one watch stream.

    Keys of `get()` are object names (`namespace/name` when watching all namespaces). Counters
    for tests and benchmarks: `lists` (lists that succeeded), `relists` (those of them after the
    first sync) and `watches` (watch streams started).
    """

    def __init__(
        self,
        api: KubeApi,
        kind: Resource,
        namespace: str | None,
        *,
        label_selector: str = "",
        timeout_seconds: int = 300,
        backoff: tuple[float, float] = DEFAULT_BACKOFF,
        transform: Transform | None = None,
    ) -> None:
        self.api, self.kind, self.namespace = api, kind, namespace
        self.label_selector = label_selector
        self.transform = transform
        self.timeout_seconds = timeout_seconds
        self.backoff = backoff
        self.resource_version = ""
        """The newest resourceVersion seen (list, event or bookmark): where a re-watch starts."""
        self.lists = self.relists = self.watches = 0
        self._cache: dict[str, Obj] = {}
        self._handlers: list[Handler] = []
        self._synced = asyncio.Event()
        self._error: errors.ClusterApiError | None = None
        self._task: asyncio.Task[None] | None = None
        self._listed = False  # the cache is current as of `resource_version`
        self._failing = False  # an outage is logged once when it starts, once when it ends

    def __repr__(self) -> str:
        where = self.namespace or "all namespaces"
        selector = f" {self.label_selector!r}" if self.label_selector else ""
        return f"<Informer {self.kind.qualified} in {where}{selector}>"

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the list+watch task (once) and wait until the first list is in the cache.
        Retries transient errors; raises the first other error (e.g. `ClusterForbidden`)."""
        if self._task is None:
            name = f"informer {self.kind.qualified} {self.namespace or '*'}"
            self._task = asyncio.get_running_loop().create_task(self._run(), name=name)
        await self.synced()

    async def synced(self) -> None:
        """Wait for the first list; raise the error that ended the informer before it."""
        await self._synced.wait()
        if self._error is not None:
            raise self._error

    @property
    def failed(self) -> bool:
        """Whether the informer stopped for good before its first sync."""
        return self._error is not None

    async def aclose(self) -> None:
        """Stop the task and close its watch stream; the cache stays readable."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])  # its finally blocks close the stream

    # -- readers (memory only) -----------------------------------------------------------

    def get(self, name: str) -> Obj | None:
        """The cached object, or None."""
        return self._cache.get(name)

    def items(self) -> list[Obj]:
        """Every cached object."""
        return list(self._cache.values())

    def add_handler(self, handler: Handler) -> None:
        """Call `handler` on every change from now on."""
        self._handlers.append(handler)

    def remove_handler(self, handler: Handler) -> None:
        """Stop calling `handler`; one not added is ignored."""
        with contextlib.suppress(ValueError):
            self._handlers.remove(handler)

    # -- the background task -------------------------------------------------------------

    async def _run(self) -> None:
        first, largest = self.backoff
        delay = first
        while True:
            just_listed = False
            try:
                if not self._listed:
                    await self._list()
                    just_listed = True
                    self._recovered()
                if await self._watch():
                    delay = first
                    continue
                log.debug("%r: the watch ended at once; waiting %.1f s", self, delay)
            except errors.ClusterGone:
                log.info("%r: resourceVersion %s expired; relisting", self, self.resource_version)
                self._listed = False
                if not just_listed:
                    continue  # relist now; only a 410 right after a list waits (no busy loop)
            except errors.ClusterUnavailable as exc:
                self._failed("%r: %s; retrying in %.1f s", exc, delay)
            except errors.ClusterApiError as exc:
                if not self._synced.is_set():
                    self._error = exc
                    self._synced.set()
                    return
                self._failed("%r: %s; relisting in %.1f s", exc, delay)
                self._listed = False
            except Exception:
                log.exception("%r: unexpected error; relisting in %.1f s", self, delay)
                self._listed = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, largest)

    def _failed(self, message: str, exc: errors.ClusterApiError, delay: float) -> None:
        """An outage is logged once, at WARNING, when it starts; then at DEBUG."""
        log.log(DEBUG if self._failing else WARNING, message, self, exc, delay)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            log.info("%r: the API server answers again", self)

    async def _list(self) -> None:
        items, version = await self.api.list(
            self.kind, self.namespace, label_selector=self.label_selector
        )
        self.lists += 1
        if self._synced.is_set():
            self.relists += 1
        if self.transform is not None:
            items = [self.transform(obj) for obj in items]
        fresh = {self._key(obj): obj for obj in items}
        old, self._cache = self._cache, fresh
        self.resource_version, self._listed = version, True
        self._synced.set()
        # What changed while no watch was open, as the watch would have told it.
        for key, gone in old.items():
            if key not in fresh:
                self._emit("DELETED", gone, gone)
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self._emit("ADDED", obj, None)
            elif _version(before) != _version(obj):
                self._emit("MODIFIED", obj, before)

    async def _watch(self) -> bool:
        """Follow one watch stream to its end; True when it delivered an event or ran for at
        least half its timeout (a normal end), False when it ended at once."""
        loop = asyncio.get_running_loop()
        started, delivered = loop.time(), False
        self.watches += 1
        events = self.api.watch(
            self.kind,
            self.namespace,
            resource_version=self.resource_version,
            label_selector=self.label_selector,
            timeout_seconds=self.timeout_seconds,
            bookmarks=True,
        )
        async with contextlib.aclosing(events):
            applied = 0
            async for event_type, obj in events:
                if not delivered:
                    self._recovered()
                delivered = True
                self._apply(event_type, obj)
                applied += 1
                if applied % BURST == 0:  # a buffered burst reads without ever waiting
                    await asyncio.sleep(0)
        return delivered or loop.time() - started >= self.timeout_seconds / 2

    def _apply(self, event_type: str, obj: Obj) -> None:
        version = _version(obj)
        if event_type == "BOOKMARK":
            self.resource_version = version or self.resource_version
            return
        if self.transform is not None:
            obj = self.transform(obj)
        key = self._key(obj)
        old = self._cache.get(key)
        if event_type == "DELETED":
            self._cache.pop(key, None)
        else:
            self._cache[key] = obj
        self.resource_version = version or self.resource_version
        self._emit(event_type, obj, old)

    def _emit(self, event_type: str, obj: Obj, old: Obj | None) -> None:
        for handler in list(self._handlers):
            try:
                handler(event_type, obj, old)
            except Exception:
                log.exception("%r: handler %r failed on %s", self, handler, event_type)

    def _key(self, obj: Obj) -> str:
        meta = obj.get("metadata") or {}
        if self.namespace is None and self.kind.namespaced:
            return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        return str(meta.get("name", ""))


def _version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Informers:
    """The shared informers of one event loop, one per (api, kind, namespace, selector)."""

    def __init__(
        self, *, timeout_seconds: int = 300, backoff: tuple[float, float] = DEFAULT_BACKOFF
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.backoff = backoff
        self._informers: dict[tuple[Any, ...], Informer] = {}

    async def get(
        self,
        api: KubeApi,
        kind: Resource,
        namespace: str | None,
        label_selector: str = "",
        *,
        transform: Transform | None = None,
    ) -> Informer:
        """The started, synced informer for this key, made on first use (with `transform`; the
        key's later callers share it as made). Concurrent callers share one start; an informer
        that failed to start is replaced on the next call."""
        key = (api, kind, namespace, label_selector)
        informer = self._informers.get(key)
        if informer is None or informer.failed:
            informer = Informer(
                api,
                kind,
                namespace,
                label_selector=label_selector,
                timeout_seconds=self.timeout_seconds,
                backoff=self.backoff,
                transform=transform,
            )
            self._informers[key] = informer
        await informer.start()
        return informer

    def __len__(self) -> int:
        return len(self._informers)

    async def drop(self, informer: Informer) -> None:
        """Close `informer` and forget it (a later `get` of its key makes a new one)."""
        self._informers = {k: i for k, i in self._informers.items() if i is not informer}
        await informer.aclose()

    async def aclose(self) -> None:
        """Close every informer."""
        informers, self._informers = list(self._informers.values()), {}
        for informer in informers:
            await informer.aclose()
