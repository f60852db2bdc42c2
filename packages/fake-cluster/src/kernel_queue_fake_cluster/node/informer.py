"""Informer-style caches for the node agent: list, then watch from the list's resourceVersion.

An `Informer` keeps every object of one kind (all namespaces, or those its selectors pick) by
(namespace, name) and tells its handlers each change in order. A watch that ends (its timeout, a
dropped connection) resumes from the last resourceVersion seen (bookmarks keep it fresh); a 410
Expired re-lists, and objects gone meanwhile are told as DELETED. A kind the server does not
serve (404 on the list) reads as empty. Runs as one task on the agent's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterator

import aiohttp

from kernel_queue_fake_cluster.common.objects import Obj
from kernel_queue_fake_cluster.node.client import ApiError, Client, path

log = logging.getLogger(__name__)

Handler = Callable[[str, Obj], None]
"""`handler(event_type, obj)`: ADDED, MODIFIED or DELETED, called on the loop, in order."""


def key_of(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


class Informer:
    """The objects of one kind (`plural` of `group`/`version`) in `namespace` (None: all),
    kept current by a watch."""

    def __init__(
        self,
        client: Client,
        plural: str,
        *,
        group: str = "",
        version: str = "v1",
        namespace: str | None = None,
        labels: str = "",
        fields: str = "",
        timeout_seconds: int = 300,
    ) -> None:
        self.client, self.plural, self.group, self.version = client, plural, group, version
        self.target = path(plural, namespace, group=group, version=version)
        self.labels, self.fields, self.timeout_seconds = labels, fields, timeout_seconds
        self.cache: dict[tuple[str, str], Obj] = {}
        self.handlers: list[Handler] = []
        self.synced = asyncio.Event()
        """Set once the first list is in the cache (or the kind is known not to be served)."""
        self.served = True
        """False when the server answered 404 for the kind."""
        self.lists = 0
        self._task: asyncio.Task[None] | None = None

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    def get(self, namespace: str | None, name: str) -> Obj | None:
        """The cached object (not a copy: do not change it), or None."""
        return self.cache.get((namespace or "", name))

    def objects(self) -> Iterator[Obj]:
        """Every cached object (a snapshot of the cache's values)."""
        yield from list(self.cache.values())

    async def fetch(self, namespace: str | None, name: str) -> Obj | None:
        """The cached object, or a fresh GET of one the watch has not brought yet (a Secret
        made just before the pod that needs it); None if the server has none."""
        found = self.get(namespace, name)
        if found is not None or not self.served:
            return found
        with contextlib.suppress(ApiError, aiohttp.ClientError, TimeoutError):
            where = path(self.plural, namespace, name, group=self.group, version=self.version)
            obj = await self.client.get(where)
            if self.get(namespace, name) is None:
                self.cache[key_of(obj)] = obj
            return self.get(namespace, name)
        return None

    def start(self) -> None:
        """Run the list-and-watch loop in a task of the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """End the loop (its watch stream closes)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        version: str | None = None
        delay = 0.0
        while True:
            try:
                if version is None:
                    version = await self._list()
                    if version is None:
                        return  # not served: nothing to watch
                began = asyncio.get_running_loop().time()
                version, events = await self._watch(version)
                # a stream that ended at once with nothing (a server going away): back off
                lasted = asyncio.get_running_loop().time() - began
                delay = 0.0 if events or lasted > 1.0 else min(max(delay * 2, 0.05), 2.0)
            except ApiError as exc:
                if exc.code == 410:
                    version, delay = None, 0.0  # expired: list again
                    continue
                log.warning("informer %s: %s", self.target, exc)
                delay = min(max(delay * 2, 0.2), 5.0)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                log.debug("informer %s: %s", self.target, exc)
                delay = min(max(delay * 2, 0.1), 5.0)
            if delay:
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))

    async def _list(self) -> str | None:
        try:
            found = await self.client.list(self.target, labels=self.labels, fields=self.fields)
        except ApiError as exc:
            if exc.code != 404:
                raise
            self.served = False
            self.synced.set()
            return None
        self.lists += 1
        fresh = {key_of(obj): obj for obj in found.get("items") or []}
        for key in [k for k in self.cache if k not in fresh]:
            self._tell("DELETED", self.cache.pop(key))
        for key, obj in fresh.items():
            old = self.cache.get(key)
            self.cache[key] = obj
            if old is None:
                self._tell("ADDED", obj)
            elif _version(old) != _version(obj):
                self._tell("MODIFIED", obj)
        self.synced.set()
        return str((found.get("metadata") or {}).get("resourceVersion") or "") or "0"

    async def _watch(self, version: str) -> tuple[str, int]:
        """Follow one stream; the last resourceVersion seen and how many events came."""
        count = 0
        async for event in self.client.watch(
            self.target,
            resource_version=version,
            labels=self.labels,
            fields=self.fields,
            timeout_seconds=self.timeout_seconds,
        ):
            kind, obj = event.get("type", ""), event.get("object") or {}
            version = _version(obj) or version
            count += 1
            if kind == "BOOKMARK":
                continue
            key = key_of(obj)
            if kind == "DELETED":
                self.cache.pop(key, None)
            elif kind in ("ADDED", "MODIFIED"):
                self.cache[key] = obj
            else:
                continue
            self._tell(kind, obj)
        return version, count

    def _tell(self, kind: str, obj: Obj) -> None:
        for handler in self.handlers:
            try:
                handler(kind, obj)
            except Exception:
                log.exception("informer %s: a handler failed on %s", self.target, kind)


def _version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
