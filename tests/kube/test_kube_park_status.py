"""Table tests of a parked pod group's status: a Workload with `spec.active: false` is PARKING
while Kueue counts its quota or a pod still stops, PARKED after (with what the checkpoint
saved), and never EVICTED; woken (`active: true`) it waits in its queue like a preempted one."""

from __future__ import annotations

from typing import Any

import pytest

from kernel_queue.kube import kueue
from kernel_queue.kube.objects import replacements
from kernel_queue.kube.queueing.status import (
    PARKING_MESSAGE,
    group_status,
    needs_replacement,
    saved_message,
)
from kernel_queue.model import GroupPhase, QueuePlace
from tests.kube_pieces.statuses import cond, pod

P = GroupPhase
SAVED = "saved 3 variables, 1.2 MB"
DEACTIVATED = cond("Evicted", True, "Deactivated", "The workload is deactivated")
RESERVED = (cond("QuotaReserved"), cond("Admitted"))
RELEASED = (
    cond("QuotaReserved", False, "Pending", "The workload is deactivated"),
    cond("Admitted", False, "NoReservation", "The workload has no reservation"),
)
PLACE = QueuePlace("user-queue", 1, 2)


def workload(*conditions: dict[str, Any], active: bool | None, ours: bool = True) -> dict[str, Any]:
    """A Workload; `ours`: parked by this server (its annotation, kept after a wake)."""
    spec = {} if active is None else {"active": active}
    meta: dict[str, Any] = {"name": "kq-1"}
    if ours:
        meta["annotations"] = {kueue.PARKED_ANNOTATION: "true"}
    return {"metadata": meta, "spec": spec, "status": {"conditions": list(conditions)}}


def reads(phase: GroupPhase, message: str) -> Any:
    """A maker of cases of a Workload and its pods that read as `phase` with `message`."""

    def case(wl: dict[str, Any], pods: list[dict[str, Any]], id: str) -> Any:
        return pytest.param(wl, pods, phase, message, id=id)

    return case


parking, parked, waits = (
    reads(P.PARKING, PARKING_MESSAGE),
    reads(P.PARKED, SAVED),
    reads(P.QUEUED, SAVED),
)
LIVE = [pod("Running", ready=True)]
STOPPED = [pod("Failed", exit_code=143, said=SAVED)]
GATED = [pod(gated=True)]
BY_KUEUE = cond("Evicted", True, "DeactivatedDueToRequeuingLimitExceeded", "The workload …")


@pytest.mark.parametrize(
    ("wl", "pods", "phase", "message"),
    [
        parking(workload(*RESERVED, active=False), LIVE, "patched-not-yet-evicted"),
        parking(
            workload(*RESERVED, DEACTIVATED, active=False),
            [pod("Running", ready=True, deleting=True)],
            "its-pod-saves-and-stops",
        ),
        parking(
            workload(*RESERVED, DEACTIVATED, active=False), STOPPED, "pod-gone-quota-still-counted"
        ),
        parked(workload(*RELEASED, DEACTIVATED, active=False), STOPPED, "quota-released"),
        parked(workload(*RELEASED, DEACTIVATED, active=False), GATED, "with-its-gated-replacement"),
        waits(workload(*RELEASED, DEACTIVATED, active=True), GATED, "woken-waits-in-its-queue"),
        waits(
            workload(*RELEASED, DEACTIVATED, active=False, ours=False),
            STOPPED,
            "stopped-by-someone-else-waits-to-be-active",
        ),
        waits(
            workload(*RELEASED, BY_KUEUE, active=False, ours=False),
            [pod("Failed", exit_code=143)],
            "deactivated-by-kueue-waits-to-be-active",
        ),
        waits(
            workload(*RELEASED, BY_KUEUE, active=False),
            [pod("Failed", exit_code=143)],
            "woken-by-someone-else-then-deactivated-by-kueue",
        ),
        pytest.param(
            workload(*RESERVED, active=None), LIVE, P.RUNNING, "", id="no-active-field-is-active"
        ),
    ],
)
def test_a_parked_group_reads_parking_then_parked_never_evicted(
    wl: dict[str, Any], pods: list[dict[str, Any]], phase: GroupPhase, message: str
) -> None:
    status = group_status(wl, pods, saved=SAVED, was_running=True, place=PLACE)
    assert (status.phase, status.message) == (phase, message)


def test_a_parked_group_whose_pods_stopped_gets_its_replacements() -> None:
    wl = workload(
        *RELEASED,
        DEACTIVATED,
        cond("WaitingForReplacementPods", True, "Deactivated", "The workload is deactivated"),
        active=False,
    )
    assert needs_replacement(wl, [pod("Failed", exit_code=143)])


def test_what_was_saved_is_read_from_the_pod_that_stopped_else_from_its_replacement() -> None:
    wl = workload(*RELEASED, DEACTIVATED, active=False)
    stopped = pod("Failed", exit_code=143, said=SAVED)
    (replacement,) = replacements.carrying([pod(gated=True)], SAVED)
    assert replacement["metadata"]["annotations"][kueue.SAVED_ANNOTATION] == SAVED
    assert saved_message(wl, [stopped]) == SAVED
    assert saved_message(wl, [replacement]) == SAVED  # a restarted server, the pod gone
    assert saved_message(wl, [pod(gated=True)]) == ""
    (again,) = replacements.carrying([replacement], "")  # nothing saved this time: none carried
    assert kueue.SAVED_ANNOTATION not in again["metadata"]["annotations"]
