"""The status event's payload against its schema: the wait estimate is a new optional field of
version 2, the parked state and its fields came in version 3, `failure` in version 4, the
sentence's facts as fields (`needs`, `has`, `priority_class`, `saving`, `waking`) in version 5,
and the $id old consumers filter on is unchanged."""

from __future__ import annotations

from typing import Any

import yaml
from jupyter_events.schema import EventSchema

from kernel_queue import errors, events
from kernel_queue.lifecycle import KernelState, Lifecycle
from kernel_queue.model import (
    CheckpointSettings,
    ConnectionInfo,
    GroupPhase,
    GroupSpec,
    GroupStatus,
    Noted,
    QueuePlace,
    Waiting,
)

SPEC = GroupSpec(
    kernel_id="k-1",
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


def test_the_schema_is_version_5_under_the_same_id_and_version_1_payloads_still_validate() -> None:
    raw = yaml.safe_load(events.SCHEMA_PATH.read_text())
    assert (raw["$id"], raw["version"]) == (events.SCHEMA_ID, "5")
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


def test_a_queued_kernel_says_what_it_needs_and_where_it_waits_as_fields() -> None:
    # As the session emits it: what the front end kept of the kernel (`Noted`), its place.
    noted = Noted.of(
        GroupSpec(**{**SPEC.__dict__, "gpus": 2, "cpu": "4", "priority_class": "high"})
    )
    status = GroupStatus(GroupPhase.QUEUED, place=QueuePlace("user-queue", 2, 3))
    data = events.status_payload(noted, "local", Lifecycle(), status, "queued in 'user-queue'")
    SCHEMA.validate(data)
    assert data["needs"] == "2 GPUs, 4 CPU"
    assert (data["queue"], data["position"], data["queue_length"]) == ("user-queue", 2, 3)
    assert (data["has"], data["failure"], data["saving"], data["waking"]) == (
        None,
        None,
        False,
        False,
    )


def test_a_kernel_of_two_pods_counts_the_gpus_of_its_whole_group() -> None:
    """`gpus` is what the kernel holds once admitted: 1 GPU on each of 2 pods is 2, whether the
    event is made from the kernel's spec (a failed launch) or from what a front end kept of it
    (`Noted`, which the parked sentence reads too: '2 GPUs released')."""
    group = GroupSpec(**{**SPEC.__dict__, "gpus": 1, "pod_group_size": 2})
    status = GroupStatus(GroupPhase.QUEUED, place=QueuePlace("user-queue", 1, 1))
    kept = events.status_payload(Noted.of(group), "kubernetes", Lifecycle(), status, "queued")
    failed = events.failed_payload(group, "kubernetes", RuntimeError("boom"))
    for data in (kept, failed):
        SCHEMA.validate(data)
        assert (data["gpus"], data["needs"]) == (2, "2 GPUs: 2 pods of 1 GPU")
    assert Noted.of(SPEC).gpus == SPEC.gpus  # one pod: its own


def test_a_kernel_that_never_fits_says_what_it_needs_and_what_the_queue_has() -> None:
    spec = GroupSpec(**{**SPEC.__dict__, "gpus": 3, "priority_class": "urgent"})
    error = errors.NeverFits(
        "kernel 1 asks for 3 GPU(s) but this machine has 2 GPU(s) in all", has={"gpus": 2}
    )
    data = events.failed_payload(spec, "local", error)
    SCHEMA.validate(data)
    assert (data["state"], data["failure"]) == ("failed", "never_fits")
    assert (data["needs"], data["has"], data["queue"]) == ("3 GPUs", {"gpus": 2}, "user-queue")
    assert data["priority_class"] == "urgent"
    # An error that does not say what the queue has: `has` is null, the rest as before.
    plain = events.failed_payload(spec, "local", errors.QueueNotFound("no queue 'user-queue'"))
    SCHEMA.validate(plain)
    assert (plain["failure"], plain["has"], plain["queue"]) == (
        "queue_not_found",
        None,
        "user-queue",
    )


def test_a_kernelspec_refused_before_queueing_names_its_priority_class_and_needs_nothing() -> None:
    config = {"backend": "local", "queue": "gpu", "gpus": 1, "priority_class": "nosuch"}
    data = events.refused_payload("k-1", config, errors.PriorityClassNotFound("no such class"))
    SCHEMA.validate(data)
    assert (data["failure"], data["priority_class"], data["needs"]) == (
        "priority_class_not_found",
        "nosuch",
        None,
    )


def test_saving_is_true_while_parking_and_while_a_checkpointing_kernel_is_preempted() -> None:
    saves = GroupSpec(**{**SPEC.__dict__, "checkpoint": CheckpointSettings(enabled=True)})
    parking = GroupStatus(GroupPhase.PARKING)
    parked = Lifecycle(KernelState.PARKED, parks=1)
    assert events.status_payload(SPEC, "local", parked, parking, "parking")["saving"] is True
    done = GroupStatus(GroupPhase.PARKED)
    assert events.status_payload(SPEC, "local", parked, done, "parked")["saving"] is False
    evicted = GroupStatus(GroupPhase.EVICTED)
    preempted = Lifecycle(KernelState.PREEMPTED)
    assert events.status_payload(Noted.of(saves), "local", preempted, evicted, "p")["saving"]
    assert not events.status_payload(Noted.of(SPEC), "local", preempted, evicted, "p")["saving"]


def test_waking_is_true_only_for_a_kernel_requeued_from_parked() -> None:
    status = GroupStatus(GroupPhase.QUEUED, place=QueuePlace("user-queue", 1, 1))
    woken = Lifecycle(KernelState.REQUEUED, parks=1, waking=True)
    data = events.status_payload(SPEC, "local", woken, status, "waking from parked")
    SCHEMA.validate(data)
    assert data["waking"] is True
    preempted = Lifecycle(KernelState.REQUEUED, preemptions=1)
    assert events.status_payload(SPEC, "local", preempted, status, "x")["waking"] is False
