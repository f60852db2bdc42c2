"""The LocalQueue reads behind a waiting kernel's sentence: one read serves the queue, again
only after `REFRESH` seconds, and a failed read leaves the queue known by its name only."""

from __future__ import annotations

import logging
from typing import Any

from kernel_queue import errors
from kernel_queue.backends.tasks import Tasks
from kernel_queue.kube.kueue import Kind
from kernel_queue.kube.queueing import local_queues, reasons
from tests import polling

LOCAL_QUEUES = Kind("kueue.x-k8s.io", "v1beta2", "localqueues", namespaced=True)
LOG = logging.getLogger(__name__)


class Api:
    """Answers `get` of LocalQueues from `queues`; counts the reads."""

    def __init__(self, queues: dict[str, dict[str, Any]]) -> None:
        self.queues, self.reads = queues, 0

    async def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any]:
        self.reads += 1
        if name not in self.queues:
            raise errors.ClusterNotFound(404, "NotFound", f'localqueues "{name}" not found')
        return self.queues[name]


async def test_one_read_serves_the_queue_until_refresh_seconds_passed() -> None:
    api = Api(
        {
            "user-queue": {
                "spec": {"clusterQueue": "gpu-cq"},
                "status": {
                    "conditions": [
                        {"type": "Active", "status": "False", "reason": "Stopped", "message": "x"}
                    ]
                },
            }
        }
    )
    now = [100.0]
    read: list[tuple[str, str]] = []
    tasks = Tasks(LOG)

    async def connect() -> Any:
        return api

    async def kind(api: Any) -> Kind:
        return LOCAL_QUEUES

    queues = local_queues.LocalQueues(
        connect=connect,
        kind=kind,
        tasks=tasks,
        on_read=lambda *key: read.append(key),
        log=LOG,
        clock=lambda: now[0],
    )
    assert queues.queue("ns", "user-queue") == reasons.Queue("user-queue")
    queues.follow("ns", "user-queue")
    queues.follow("ns", "user-queue")
    await polling.until(lambda: read, "the LocalQueue read", every=0)
    assert (api.reads, read) == (1, [("ns", "user-queue")])
    assert queues.settled("ns", "user-queue")
    assert queues.queue("ns", "user-queue") == reasons.Queue(
        "user-queue", "gpu-cq", ("False", "Stopped", "x")
    )
    now[0] += local_queues.REFRESH
    queues.follow("ns", "user-queue")
    await polling.until(lambda: len(read) == 2, "the second read", every=0)
    assert api.reads == 2
    queues.follow("ns", "missing")
    await polling.until(lambda: queues.settled("ns", "missing"), "the failed read", every=0)
    assert queues.queue("ns", "missing") == reasons.Queue("missing")
    await tasks.aclose()
    queues.follow("ns", "other")  # closed: nothing more is read
    assert api.reads == 3
