"""The store's committed changes as watches see them: `WatchEvent`s, the bounded `ChangeLog` a
watch from a resourceVersion replays, and each watch's `Subscription`.

A subscription filters events by type, namespace and selector, and turns a MODIFIED that moves
an object into or out of its selection into ADDED or DELETED, as the apiserver's watch cache
does. Serving a subscription over HTTP is `watches.py`'s job; committing changes the store's.
"""

from __future__ import annotations

import asyncio
import collections
import copy
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.common import selectors


@dataclass(frozen=True)
class WatchEvent:
    """One change: ADDED, MODIFIED, DELETED (or BOOKMARK from the server)."""

    type: str
    object: Obj
    resource_version: int
    key: tuple[str, str]


class Subscription:
    """A watch on one type: an async iterator of `WatchEvent`s until `close()`."""

    def __init__(
        self,
        log: ChangeLog,
        key: tuple[str, str],
        namespace: str | None,
        match: selectors.Matcher,
    ) -> None:
        self._log, self.key, self.namespace, self._match = log, key, namespace, match
        self._queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        self.closed = False

    def _offer(self, event: WatchEvent, old: Obj | None) -> None:
        if event.key != self.key:
            return
        if self.namespace and event.object["metadata"].get("namespace") != self.namespace:
            return
        now, before = self._match(event.object), old is not None and self._match(old)
        if event.type == "MODIFIED" and now != before:
            kind = "ADDED" if now else "DELETED"  # entering or leaving the selection
            event = WatchEvent(kind, event.object, event.resource_version, event.key)
        elif not now and not (event.type == "DELETED" and before):
            return
        self._queue.put_nowait(event)

    def close(self) -> None:
        """Stop the stream; the iterator ends."""
        if not self.closed:
            self.closed = True
            self._log.forget(self)
            self._queue.put_nowait(None)

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        while (event := await self._queue.get()) is not None:
            yield event


class ChangeLog:
    """The last `history` committed changes (each with the object as it was before) and the
    open subscriptions; every change is offered to each of them as it is published."""

    def __init__(self, history: int) -> None:
        self._history: collections.deque[tuple[WatchEvent, Obj | None]] = collections.deque(
            maxlen=history
        )
        self._subscriptions: set[Subscription] = set()

    def publish(self, event: WatchEvent, old: Obj | None) -> None:
        """Log one committed change and offer it to every open subscription."""
        self._history.append((event, old))
        for subscription in list(self._subscriptions):
            subscription._offer(event, old)

    def subscribe(
        self,
        key: tuple[str, str],
        namespace: str | None,
        match: selectors.Matcher,
        *,
        since: int | None,
        current: int,
        snapshot: Iterable[Obj],
    ) -> Subscription:
        """A subscription fed first with ADDED for each object of `snapshot` (`since` None or
        0), or with the logged changes after `since` (410 Expired when they left the log; the
        store is at resourceVersion `current`), then with each change as it comes."""
        subscription = Subscription(self, key, namespace, match)
        if since:
            oldest = self._history[0][0].resource_version if self._history else current + 1
            if since < oldest - 1 and since < current:
                raise ApiError(410, "Expired", f"too old resource version: {since} ({oldest - 1})")
            for event, old in self._history:
                if event.resource_version > since:
                    subscription._offer(event, old)
        else:
            for obj in snapshot:
                rv = int(obj["metadata"]["resourceVersion"])
                subscription._offer(WatchEvent("ADDED", copy.deepcopy(obj), rv, key), None)
        self._subscriptions.add(subscription)
        return subscription

    def forget(self, subscription: Subscription) -> None:
        """Offer `subscription` nothing more (it closed)."""
        self._subscriptions.discard(subscription)

    def close_all(self) -> None:
        """End every open subscription."""
        for subscription in list(self._subscriptions):
            subscription.close()

    @property
    def open(self) -> int:
        """Subscriptions open now."""
        return len(self._subscriptions)
