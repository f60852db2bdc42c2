"""Queue positions from Kueue's visibility API: one read per LocalQueue serves all its kernels.

`read_places` returns Workload name -> `QueuePlace`; when the visibility API is unavailable it
falls back to the LocalQueue's pending count for every kernel (key ""), and says so in the log
once until it answers again (`Warned`).
"""

from __future__ import annotations

import logging
from typing import Any

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
