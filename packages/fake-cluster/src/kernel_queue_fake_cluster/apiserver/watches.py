"""Watch streams of the fake API server: chunked JSON lines, one `{"type", "object"}` each.

Owns the open streams of one server: subscribing (through `Store.watch`, which snapshots and
subscribes in one step), BOOKMARK lines while idle, `timeoutSeconds`, the single 410 ERROR
line, ending cleanly on client disconnect or `drop()`, and the open/peak counts. It does not
route requests or decide who may watch; `server.py` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

import tornado.iostream

from kernel_queue_fake_cluster.apiserver import discovery
from kernel_queue_fake_cluster.apiserver.changes import Subscription, WatchEvent
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType
from kernel_queue_fake_cluster.apiserver.store import Store


class Stream(Protocol):
    """The request handler side of one watch (a tornado RequestHandler)."""

    subscription: Subscription | None

    def set_header(self, name: str, value: str) -> None: ...

    def write(self, chunk: bytes) -> None: ...

    def flush(self) -> asyncio.Future[None]: ...

    def finish(self) -> asyncio.Future[None]: ...


class Watches:
    """The open watch streams of one server."""

    def __init__(self, store: Store, bookmark_interval: float) -> None:
        self.store = store
        self.bookmark_interval = bookmark_interval
        """Idle seconds before a BOOKMARK line on watches that allow them."""
        self.expire = 0
        """How many coming watch requests get the 410 ERROR line."""
        self.open: set[Subscription] = set()
        """The counted open streams (the cluster's own components' are not: `system`)."""
        self.system: set[Subscription] = set()
        self.peak = 0
        self._none_open = asyncio.Event()
        self._none_open.set()

    def drop(self) -> None:
        """End every open stream now."""
        for subscription in [*self.open, *self.system]:
            subscription.close()

    async def drain(self) -> None:
        """End every open stream and wait until each has written its last chunk."""
        self.drop()
        await self._none_open.wait()

    async def serve(
        self,
        stream: Stream,
        rtype: ResourceType,
        target: discovery.Target,
        query: Mapping[str, str],
        present: Callable[[Obj], Obj] | None = None,
        *,
        counted: bool = True,
    ) -> None:
        """Write one watch response until timeout, drop, disconnect or server stop; `present`
        turns each event's object into what the client asked for (a Table, `tables.py`);
        `counted`: in `open` and `peak` (False: a system component's, and no 410 fault)."""
        fields = query.get("fieldSelector", "")
        if target.name:  # a watch on one object's path
            fields = ",".join(filter(None, (fields, f"metadata.name={target.name}")))
        since = discovery.number(query, "resourceVersion")
        timeout = discovery.number(query, "timeoutSeconds")
        bookmarks = discovery.flag(query, "allowWatchBookmarks")
        stream.set_header("Content-Type", "application/json")
        try:
            if self.expire and counted:
                self.expire -= 1
                raise ApiError(410, "Expired", f"too old resource version: {since or 0}")
            subscription = self.store.watch(
                target.group,
                target.plural,
                target.namespace or None,
                since=since,
                labels=query.get("labelSelector", ""),
                fields=fields,
            )
        except ApiError as exc:
            if exc.code != 410:
                raise
            stream.write(discovery.dump({"type": "ERROR", "object": exc.status()}) + b"\n")
            return
        streams = self.open if counted else self.system
        streams.add(subscription)
        self._none_open.clear()
        self.peak = max(self.peak, len(self.open))
        stream.subscription = subscription
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            await stream.flush()  # the headers now, so the client's call returns
            await self._events(
                stream, subscription, rtype, target.version, deadline, bookmarks, present
            )
        except tornado.iostream.StreamClosedError:
            pass  # the client went away
        finally:
            subscription.close()
            stream.finish()  # the last chunk goes out before the stream counts as closed
            streams.discard(subscription)
            if not self.open and not self.system:
                self._none_open.set()

    async def _events(
        self,
        stream: Stream,
        subscription: Subscription,
        rtype: ResourceType,
        version: str,
        deadline: float | None,
        bookmarks: bool,
        present: Callable[[Obj], Obj] | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        events = aiter(subscription)
        # One pending read survives the idle timeouts: cancelling a read would end the iterator.
        pending: asyncio.Task[WatchEvent | None] | None = None
        try:
            while True:
                wait, bookmark = (self.bookmark_interval, True) if bookmarks else (None, False)
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        return
                    if wait is None or left < wait:
                        wait, bookmark = left, False
                pending = pending or asyncio.create_task(_next(events))
                done, _ = await asyncio.wait((pending,), timeout=wait)
                if not done:
                    await asyncio.sleep(0)  # let an event that just arrived win over a bookmark
                    if bookmark and not pending.done():
                        meta = {"resourceVersion": str(self.store.resource_version)}
                        api_version = rtype.api_version(version)
                        idle = {"kind": rtype.kind, "apiVersion": api_version, "metadata": meta}
                        await _send(stream, {"type": "BOOKMARK", "object": idle})
                    continue
                event, pending = pending.result(), None
                if event is None:
                    return
                obj = self.store.versions.at(rtype, event.object, version)
                if present is not None:
                    obj = present(obj)
                await _send(stream, {"type": event.type, "object": obj})
        finally:
            if pending is not None:
                pending.cancel()


async def _next(events: AsyncIterator[WatchEvent]) -> WatchEvent | None:
    return await anext(events, None)


async def _send(stream: Stream, event: Obj) -> None:
    stream.write(discovery.dump(event) + b"\n")
    await stream.flush()
