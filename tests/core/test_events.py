"""The status event's payload against its schema: the wait estimate is a new optional field of
version 2, the parked state and its fields came in version 3, `failure` in version 4, and the
$id old consumers filter on is unchanged."""

from __future__ import annotations

from typing import Any

import yaml
from jupyter_events.schema import EventSchema

from kernel_queue import errors, events
from kernel_queue.lifecycle import KernelState, Lifecycle
from kernel_queue.model import (
    ConnectionInfo,
    GroupPhase,
    GroupSpec,
    GroupStatus,
    QueuePlace,
    Waiting,
)

SPEC = GroupSpec(
    kernel_id="k-1",
    name="kq-1",
    queue="user-queue",
    argv=("python",),
    connection=ConnectionInfo("127.0.0.1", 1, 2, 3, 4, 5, "key"),
    gpus=1,
)
SCHEMA = EventSchema(events.SCHEMA_PATH)


def payload(state: KernelState, status: GroupStatus) -> dict[str, Any]:
    data = events.status_payload(SPEC, "kubernetes", Lifecycle(state), status, "the sentence")
    SCHEMA.validate(data)
    return data


def test_a_queued_kernel_carries_the_estimate_in_whole_seconds() -> None:
    status = GroupStatus(
        GroupPhase.QUEUED, place=QueuePlace("user-queue", 3, 5), waiting=Waiting(estimate=239.6)
    )
    data = payload(KernelState.QUEUED, status)
    assert (data["position"], data["queue_length"]) == (3, 5)
    assert data["estimated_wait_seconds"] == 240


def test_without_enough_admissions_or_once_admitted_the_estimate_is_null() -> None:
    queued = GroupStatus(GroupPhase.QUEUED, place=QueuePlace("user-queue", 1, 1))
    assert payload(KernelState.QUEUED, queued)["estimated_wait_seconds"] is None
    stale = GroupStatus(GroupPhase.RUNNING, waiting=Waiting(estimate=60.0))
    assert payload(KernelState.RUNNING, stale)["estimated_wait_seconds"] is None


def test_a_parked_kernel_says_since_when_and_how_often_and_others_say_null() -> None:
    since = "2026-12-01T20:00:00+00:00"
    parked = Lifecycle(KernelState.PARKED, parks=2)
    status = GroupStatus(GroupPhase.PARKED, message="saved 2 variables, 1.0 KiB")
    data = events.status_payload(SPEC, "local", parked, status, "parked", parked_since=since)
    SCHEMA.validate(data)
    assert (data["state"], data["parks"], data["parked_since"]) == ("parked", 2, since)
    running = events.status_payload(
        SPEC, "local", Lifecycle(KernelState.RESUMED, parks=2), status, "x", parked_since=since
    )
    assert (running["parks"], running["parked_since"]) == (2, None)


def test_the_schema_is_version_4_under_the_same_id_and_version_1_payloads_still_validate() -> None:
    raw = yaml.safe_load(events.SCHEMA_PATH.read_text())
    assert (raw["$id"], raw["version"]) == (events.SCHEMA_ID, "4")
    assert raw["$id"].endswith("/kernel-status/v1")  # what consumers of version 1 listen for
    old = {"kernel_id": "k-1", "state": "queued", "message": "queued in 'user-queue'"}
    SCHEMA.validate({**old, "position": 1, "queue_length": 1, "gpus": 1})


def test_a_failed_kernel_says_what_kind_of_failure_and_others_say_null() -> None:
    error = errors.NeverFits("kernel 1 asks for 3 GPU(s) but this machine has 2 GPU(s) in all")
    failed = events.status_payload(
        SPEC,
        "local",
        Lifecycle(KernelState.FAILED),
        GroupStatus(GroupPhase.FAILED),
        str(error),
        failure=events.failure_kind(error),
    )
    SCHEMA.validate(failed)
    assert (failed["state"], failed["failure"]) == ("failed", "never_fits")
    queued = events.status_payload(
        SPEC, "local", Lifecycle(), GroupStatus(GroupPhase.QUEUED), "queued", failure="launch"
    )
    assert queued["failure"] is None
    assert events.failure_kind(RuntimeError("boom")) == "launch"
    assert events.failure_kind(errors.QueueNotFound("x")) == "queue_not_found"
