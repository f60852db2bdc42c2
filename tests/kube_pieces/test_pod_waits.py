"""A waiting pod group's status as `waits.Waits` completes it: Kueue's reason with the
ClusterQueue named, the never-fits failure, the estimate from observed admissions, and the
one reminder that names a silent Kueue."""

from __future__ import annotations

import logging
from typing import Any

from kernel_queue.backends.kubernetes import waits as pod_waits
from kernel_queue.backends.tasks import Tasks
from kernel_queue.kube.kueue import Kind
from kernel_queue.model import GroupPhase, GroupStatus, QueuePlace, Waiting
from tests import polling

LOG = logging.getLogger(__name__)
LOCAL_QUEUES = Kind("kueue.x-k8s.io", "v1beta2", "localqueues", namespaced=True)
MAX = (
    "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor "
    "default-flavor, request > maximum capacity (3 > 2)"
)
SHORT = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in "
    "flavor default-flavor, 1 more needed"
)
QUEUED = GroupStatus(GroupPhase.QUEUED, place=QueuePlace("user-queue", 2, 2))


class Api:
    async def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any]:
        return {"spec": {"clusterQueue": "gpu-cq"}}


def workload(name: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"queueName": "user-queue"},
        "status": {"conditions": list(conditions)},
    }


def admitted(name: str, at: str) -> dict[str, Any]:
    return workload(
        name,
        {"type": "QuotaReserved", "status": "True", "lastTransitionTime": at},
        {"type": "Admitted", "status": "True", "lastTransitionTime": at},
    )


def pending(message: str) -> dict[str, Any]:
    condition = {"type": "QuotaReserved", "status": "False", "reason": "Pending"}
    return workload("kq-mine", {**condition, "message": message})


def waits(tasks: Tasks, refreshed: list[str], *, now: float = 1000.0) -> pod_waits.Waits:
    async def connect() -> Any:
        return Api()

    async def kind(api: Any) -> Kind:
        return LOCAL_QUEUES

    return pod_waits.Waits(
        connect=connect,
        local_queue_kind=kind,
        tasks=tasks,
        within=lambda: 30.0,
        refresh=refreshed.append,
        queue_read=lambda namespace, queue: refreshed.append(f"read {queue}"),
        log=LOG,
        clock=lambda: now,
        wall=lambda: 1_800_000_100.0,  # 2027-01-15T08:01:40Z
    )


def explain(w: pod_waits.Waits, status: GroupStatus, wl: Any, since: float = 990.0) -> Any:
    return w.explain(
        status,
        wl,
        name="kq-mine",
        namespace="ns",
        queue="user-queue",
        spec=None,
        place=status.place,
        since=since,
    )


async def test_a_never_fitting_request_fails_once_its_cluster_queue_is_known() -> None:
    tasks, refreshed = Tasks(LOG), []
    w = waits(tasks, refreshed)
    assert explain(w, QUEUED, pending(MAX)) == QUEUED  # the LocalQueue is being read
    await polling.until(lambda: "read user-queue" in refreshed, "the LocalQueue read", every=0)
    failed = explain(w, QUEUED, pending(MAX))
    assert failed == GroupStatus(
        GroupPhase.FAILED,
        message="asks for 3 nvidia.com/gpu but ClusterQueue 'gpu-cq' can never give more than "
        "2, so it could never start. Ask for fewer `gpus` in the kernelspec, or use a `queue` "
        "whose ClusterQueue has more.",
        never_fits=True,
        has={"gpus": 2},
    )
    w.aclose()
    await tasks.aclose()


async def test_admissions_seen_in_the_queue_give_the_estimate() -> None:
    tasks, refreshed = Tasks(LOG), []
    w = waits(tasks, refreshed)
    for name, at in (("a", "07:57:40"), ("b", "07:58:40"), ("c", "07:59:40")):
        w.observe("ns", admitted(f"kq-{name}", f"2027-01-15T{at}Z"))
        w.observe("ns", admitted(f"kq-{name}", f"2027-01-15T{at}Z"))  # seen again: counted once
    w.observe("ns", workload("kq-d"))  # not admitted: not an admission
    explain(w, QUEUED, pending(SHORT))
    await polling.until(lambda: "read user-queue" in refreshed, "the LocalQueue read", every=0)
    status = explain(w, QUEUED, pending(SHORT))
    # 2 admissions in the 240 s since the first: one each 120 s; position 2: 240 s
    assert status.waiting == Waiting(
        "waiting for 1 more nvidia.com/gpu to free up in ClusterQueue 'gpu-cq'", estimate=240.0
    )
    w.aclose()
    await tasks.aclose()


async def test_a_silent_kueue_is_named_once_it_had_its_time() -> None:
    tasks, refreshed = Tasks(LOG), []
    early = waits(tasks, refreshed, now=1000.0)
    pending_group = GroupStatus(GroupPhase.PENDING)
    assert explain(early, pending_group, None, since=999.99) == pending_group
    late = waits(tasks, refreshed, now=1031.0)
    silent = explain(late, pending_group, None, since=1000.0)
    assert silent.waiting == Waiting(
        "no Workload for the kernel's pods after 30 s: is Kueue's controller running in the "
        "cluster?",
        answered=False,
    )
    early.aclose()
    late.aclose()
    await tasks.aclose()


async def test_the_reminder_refreshes_the_group_when_its_time_is_up() -> None:
    tasks, refreshed = Tasks(LOG), []
    w = waits(tasks, refreshed, now=1000.0)
    explain(w, GroupStatus(GroupPhase.PENDING), None, since=1000.0 - 29.95)
    explain(w, GroupStatus(GroupPhase.PENDING), None, since=1000.0 - 29.95)  # one reminder
    await polling.until(lambda: "kq-mine" in refreshed, "the reminder", within=5, every=0.01)
    assert refreshed.count("kq-mine") == 1
    w.aclose()
    await tasks.aclose()
