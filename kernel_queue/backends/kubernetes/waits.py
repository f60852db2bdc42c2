"""What a waiting pod group of the kubernetes backend waits for, and how long it may take.

`Waits.explain` turns a queued (or not yet queued) group's status into one that says why it
waits (`kube.queueing.reasons`, from its Workload and its LocalQueue, which
`kube.queueing.local_queues` reads) and estimates the wait from the admissions seen in its
LocalQueue (`wait_estimate`), or into a failure when the queue could never admit what the kernel
asks for. `observe` notes the admission of every Workload the informers report (this server's,
or every one of the namespace where Kueue does not copy the owner label), `observe_left` those
of other servers' Workloads that left the queue while ours waited (`positions`): no request of
its own. One timer per waiting group, set at its first status, refreshes it when Kueue
has had `within()` seconds to answer, so a silent Kueue is named without polling.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kernel_queue import wait_estimate
from kernel_queue.kube import kueue
from kernel_queue.kube.client.verbs import KubeApi, Resource
from kernel_queue.kube.queueing import local_queues, reasons
from kernel_queue.model import GroupPhase, GroupSpec, GroupStatus, QueuePlace, Waiting

Obj = Mapping[str, Any]
DEFAULT_GPU = "nvidia.com/gpu"


def keys(spec: GroupSpec | None) -> dict[str, str]:
    """Resource name -> the kernelspec key that asks for it."""
    gpu = spec.gpu_resource if spec is not None else DEFAULT_GPU
    found = {gpu: "gpus", "cpu": "cpu", "memory": "memory"}
    if spec is not None and spec.pod_group_size > 1:  # each key asks per pod
        found[reasons.GROUP_SIZE] = str(spec.pod_group_size)
    return found


def admitted_at(workload: Obj) -> tuple[str, float | None]:
    """When Kueue admitted the Workload: its Admitted condition's lastTransitionTime, as written
    and as seconds since the epoch (None when missing or unreadable)."""
    stamp = str((kueue.condition(workload, kueue.ADMITTED) or {}).get("lastTransitionTime") or "")
    try:
        return stamp, datetime.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return stamp, None


class Waits:
    """The reasons and estimates of the backend's waiting groups."""

    def __init__(
        self,
        *,
        connect: Callable[[], Awaitable[KubeApi]],
        local_queue_kind: Callable[[KubeApi], Awaitable[Resource]],
        tasks: local_queues.Spawner,
        within: Callable[[], float],
        refresh: Callable[[str], None],
        queue_read: Callable[[str, str], None],
        log: logging.Logger | logging.LoggerAdapter[Any],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._within, self._refresh, self._clock, self._wall = within, refresh, clock, wall
        self.queues = local_queues.LocalQueues(
            connect=connect, kind=local_queue_kind, tasks=tasks, on_read=queue_read, log=log
        )
        self.admissions = wait_estimate.Admissions()
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def observe(self, namespace: str, workload: Obj | None) -> None:
        """Note the Workload's admission in its LocalQueue, once per admission."""
        if workload is None or not kueue.workload_admitted(workload):
            return
        queue = str((workload.get("spec") or {}).get("queueName") or "")
        meta = workload.get("metadata") or {}
        stamp, at = admitted_at(workload)
        key = (meta.get("name", ""), stamp or meta.get("uid", ""))
        self.admissions.observe((namespace, queue), key, self._wall() if at is None else at)

    def observe_left(self, namespace: str, queue: str, names: set[str]) -> None:
        """Note `names` (not ours) leaving the LocalQueue `queue` now as admissions."""
        now = self._wall()
        for name in sorted(names):
            self.admissions.observe((namespace, queue), (name, "left", int(now)), now)

    def explain(
        self,
        status: GroupStatus,
        workload: Obj | None,
        *,
        name: str,
        namespace: str,
        queue: str,
        spec: GroupSpec | None,
        place: QueuePlace | None,
        since: float,
    ) -> GroupStatus:
        """`status` (QUEUED or PENDING) with why it waits and the estimate, or FAILED with
        `never_fits` when the queue could never admit the kernel. A never-fitting request
        waits for the first read of its LocalQueue, so its sentence names the ClusterQueue."""
        self.queues.follow(namespace, queue)
        within, waited = self._within(), self._clock() - since
        reason = reasons.explain(
            workload,
            queue=self.queues.queue(namespace, queue),
            positioned=place is not None,
            waited=waited,
            within=within,
            keys=keys(spec),
        )
        if reason.never:
            if not self.queues.settled(namespace, queue):
                return status
            return GroupStatus(
                GroupPhase.FAILED, message=reason.never, never_fits=True, has=reason.has
            )
        if within > 0 and waited < within and name not in self._timers:
            self._remind(name, within - waited)
        estimate = None
        if reason.estimable and place is not None and place.position:
            key = (namespace, queue)
            estimate = self.admissions.estimate(key, now=self._wall(), position=place.position)
        if not reason.why and estimate is None:
            return status
        return status.evolve(waiting=Waiting(reason.why, reason.answered, estimate))

    def _remind(self, name: str, after: float) -> None:
        """Refresh the group once Kueue has had its time to answer."""

        def fire() -> None:
            self._timers.pop(name, None)
            self._refresh(name)

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # refreshed outside the loop (a test): no reminder
            return
        self._timers[name] = loop.call_later(max(after, 0.0) + 0.01, fire)

    def aclose(self) -> None:
        """Cancel the timers and forget the queues (the backend closes)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self.queues.clear()
