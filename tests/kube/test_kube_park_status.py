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
from tests.kube_pieces.test_kube_status import cond, pod

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


@pytest.mark.parametrize(
    ("wl", "pods", "phase", "message"),
    [
        pytest.param(
            workload(*RESERVED, active=False),
            [pod("Running", ready=True)],
            P.PARKING,
            PARKING_MESSAGE,
            id="patched-not-yet-evicted",
        ),
        pytest.param(
            workload(*RESERVED, DEACTIVATED, active=False),
            [pod("Running", ready=True, deleting=True)],
            P.PARKING,
            PARKING_MESSAGE,
            id="its-pod-saves-and-stops",
        ),
        pytest.param(
            workload(*RESERVED, DEACTIVATED, active=False),
            [pod("Failed", exit_code=143, said=SAVED)],
            P.PARKING,
            PARKING_MESSAGE,
            id="pod-gone-quota-still-counted",
        ),
        pytest.param(
            workload(*RELEASED, DEACTIVATED, active=False),
            [pod("Failed", exit_code=143, said=SAVED)],
            P.PARKED,
            SAVED,
            id="quota-released",
        ),
        pytest.param(
            workload(*RELEASED, DEACTIVATED, active=False),
            [pod(gated=True)],
            P.PARKED,
            SAVED,
            id="with-its-gated-replacement",
        ),
        pytest.param(
            workload(*RELEASED, DEACTIVATED, active=True),
            [pod(gated=True)],
            P.QUEUED,
            SAVED,
            id="woken-waits-in-its-queue",
        ),
        pytest.param(
            workload(*RELEASED, DEACTIVATED, active=False, ours=False),
            [pod("Failed", exit_code=143, said=SAVED)],
            P.QUEUED,
            SAVED,
            id="stopped-by-someone-else-waits-to-be-active",
        ),
        pytest.param(
            workload(
                *RELEASED,
                cond("Evicted", True, "DeactivatedDueToRequeuingLimitExceeded", "The workload …"),
                active=False,
                ours=False,
            ),
            [pod("Failed", exit_code=143)],
            P.QUEUED,
            SAVED,
            id="deactivated-by-kueue-waits-to-be-active",
        ),
        pytest.param(
            workload(
                *RELEASED,
                cond("Evicted", True, "DeactivatedDueToRequeuingLimitExceeded", "The workload …"),
                active=False,
            ),
            [pod("Failed", exit_code=143)],
            P.QUEUED,
            SAVED,
            id="woken-by-someone-else-then-deactivated-by-kueue",
        ),
        pytest.param(
            workload(*RESERVED, active=None),
            [pod("Running", ready=True)],
            P.RUNNING,
            "",
            id="no-active-field-is-active",
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
