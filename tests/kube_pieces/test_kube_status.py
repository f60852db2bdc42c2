"""Table tests of how a pod group's Workload and pods become a GroupStatus."""

from __future__ import annotations

from typing import Any

import pytest

from kernel_queue.kube.queueing.status import (
    group_status,
    kernel_endpoint,
    needs_replacement,
    saved_message,
)
from kernel_queue.model import GroupPhase, QueuePlace
from tests.kube_pieces.statuses import cond, pod, workload

P = GroupPhase
ADMITTED = (cond("QuotaReserved"), cond("Admitted"))
PLACE = QueuePlace("user-queue", 2, 3)


@pytest.mark.parametrize(
    ("wl", "pods", "options", "phase", "message"),
    [
        pytest.param(
            None, [pod(gated=True)], {}, P.PENDING, "waiting for Kueue", id="no-workload-yet"
        ),
        pytest.param(
            None,
            [],
            {"had_workload": True},
            P.FINISHED,
            "Workload was deleted",
            id="workload-deleted",
        ),
        pytest.param(workload(), [pod(gated=True)], {}, P.QUEUED, "", id="queued"),
        pytest.param(
            workload(*ADMITTED), [pod(gated=True)], {}, P.ADMITTED, "", id="admitted-still-gated"
        ),
        pytest.param(
            workload(*ADMITTED),
            [pod(waiting=("ImagePullBackOff", 'Back-off pulling image "x"'))],
            {},
            P.ADMITTED,
            'ImagePullBackOff: Back-off pulling image "x"',
            id="image-pull-back-off",
        ),
        pytest.param(
            workload(*ADMITTED), [pod("Running", ready=True)], {}, P.RUNNING, "", id="ready"
        ),
        pytest.param(
            workload(*ADMITTED),
            [pod("Failed", exit_code=3)],
            {},
            P.FAILED,
            "ended with exit code 3 before it was ready",
            id="failed-before-ready",
        ),
        pytest.param(
            workload(*ADMITTED),
            [pod("Failed", exit_code=1)],
            {"was_running": True},
            P.FINISHED,
            "the kernel ended with exit code 1",
            id="kernel-crashed-after-ready",
        ),
        pytest.param(
            workload(*ADMITTED, cond("Evicted", reason="Preempted", message="Preempted to fit")),
            [pod("Running", ready=True, deleting=True), pod("Running", ready=True)],
            {},
            P.EVICTED,
            "Preempted to fit",
            id="evicted-while-pods-stop",
        ),
        pytest.param(  # its pod's delete can reach the server before its Workload's eviction:
            # the kernel still saves its checkpoint; "requeued" now would skip "preempted"
            workload(*ADMITTED, cond("Evicted", reason="Preempted", message="Preempted to fit")),
            [pod("Running", ready=True, deleting=True)],
            {"was_running": True},
            P.EVICTED,
            "Preempted to fit",
            id="evicted-while-its-only-pod-is-being-deleted",
        ),
        pytest.param(
            workload(cond("Evicted", reason="Preempted"), cond("Requeued", reason="Preempted")),
            [
                pod("Failed", exit_code=143, deleting=True),
                pod(gated=True, created="2026-11-30T00:01:00Z"),
            ],
            {"was_running": True},
            P.QUEUED,
            "",
            id="replacements-queued",
        ),
        pytest.param(
            workload(cond("Evicted", reason="Preempted"), cond("Requeued", reason="Preempted")),
            [
                pod("Failed", exit_code=143, deleting=True, said="saved 2 variables (1 kB)\n"),
                pod(gated=True, created="2026-11-30T00:01:00Z"),
            ],
            {"was_running": True, "saved": "saved 2 variables (1 kB)"},
            P.QUEUED,
            "saved 2 variables (1 kB)",
            id="requeued-says-what-the-evicted-pod-saved",
        ),
        pytest.param(
            workload(cond("Evicted", reason="Preempted"), cond("Requeued", reason="Preempted")),
            [pod(gated=True, created="2026-11-30T00:01:00Z")],
            {"was_running": True, "saved": "saved 2 variables (1 kB)"},
            P.QUEUED,
            "saved 2 variables (1 kB)",
            id="requeued-keeps-the-sentence-after-the-pod-is-gone",
        ),
        pytest.param(
            workload(),
            [pod(gated=True)],
            {"saved": "saved 2 variables (1 kB)"},
            P.QUEUED,
            "",
            id="no-eviction-no-sentence",
        ),
        pytest.param(
            workload(cond("Finished", reason="Succeeded", message="Pods succeeded: 1/1.")),
            [pod("Succeeded", exit_code=0)],
            {},
            P.FINISHED,
            "Pods succeeded: 1/1.",
            id="finished",
        ),
    ],
)
def test_group_status(
    wl: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    options: dict[str, Any],
    phase: GroupPhase,
    message: str,
) -> None:
    status = group_status(wl, pods, place=PLACE, **options)
    assert status.phase is phase
    assert message in status.message
    if not message:
        assert status.message == "" or phase is not P.QUEUED
    if phase is P.QUEUED:
        assert status.place == PLACE


def test_running_reports_the_flavor_and_the_pod_ip_when_asked() -> None:
    wl = workload(*ADMITTED, flavors=("a100",))
    status = group_status(wl, [pod("Running", ready=True, ip="127.10.3.4")], pod_ip_address=True)
    assert (status.phase, status.flavor, status.address) == (P.RUNNING, "a100", "127.10.3.4")
    assert group_status(wl, [pod("Running", ready=True)]).address == ""


@pytest.mark.parametrize(
    ("wl", "pods", "expected"),
    [
        pytest.param(
            workload(cond("WaitingForReplacementPods", reason="Preempted")),
            [pod("Failed", exit_code=143)],
            True,
            id="waiting-and-old-pods-stopped",
        ),
        pytest.param(
            workload(cond("WaitingForReplacementPods")),
            [pod("Running", ready=True)],
            False,
            id="old-pod-still-running",
        ),
        pytest.param(
            workload(cond("WaitingForReplacementPods")),
            [pod("Failed", exit_code=143), pod(gated=True)],
            False,
            id="replacement-exists",
        ),
        pytest.param(workload(*ADMITTED), [pod("Failed", exit_code=1)], False, id="not-evicted"),
        pytest.param(
            workload(*ADMITTED, cond("WaitingForReplacementPods", reason="PodsFailed")),
            [pod("Failed", exit_code=3)],
            False,
            id="a-crash-is-no-eviction",
        ),
        pytest.param(None, [], False, id="no-workload"),
    ],
)
def test_needs_replacement(
    wl: dict[str, Any] | None, pods: list[dict[str, Any]], expected: bool
) -> None:
    assert needs_replacement(wl, pods) is expected


@pytest.mark.parametrize(
    ("wl", "pods", "expected"),
    [
        pytest.param(
            workload(cond("Evicted", reason="Preempted"), cond("Requeued", reason="Preempted")),
            [
                pod("Failed", exit_code=143, deleting=True, said="saved 2 variables (1 kB)\n"),
                pod(gated=True, created="2026-11-30T00:01:00Z"),
            ],
            "saved 2 variables (1 kB)",
            id="the-evicted-head-pod-says-it",
        ),
        pytest.param(
            workload(cond("Evicted", reason="Preempted")),
            [pod("Running", ready=True)],
            "",
            id="the-pod-has-not-ended",
        ),
        pytest.param(
            workload(*ADMITTED),
            [pod("Failed", exit_code=143, said="saved 2 variables (1 kB)")],
            "",
            id="not-evicted",
        ),
        pytest.param(None, [], "", id="no-workload"),
    ],
)
def test_saved_message(
    wl: dict[str, Any] | None, pods: list[dict[str, Any]], expected: str
) -> None:
    assert saved_message(wl, pods) == expected


def test_a_head_whose_kernel_the_server_reached_runs_before_it_is_ready() -> None:
    wl = workload(*ADMITTED)
    started = pod("Running", ip="127.10.3.4")
    assert group_status(wl, [started]).phase is P.ADMITTED
    reached = group_status(wl, [started], listening="uid-1", pod_ip_address=True)
    assert (reached.phase, reached.kernel_alive, reached.address) == (P.RUNNING, True, "127.10.3.4")
    # another pod's answer (the head before a replacement) says nothing of this one
    assert group_status(wl, [started], listening="uid-0").phase is P.ADMITTED
    # a head that ended is the kernel's end or failure whatever was reached before
    ended = group_status(wl, [pod("Failed", exit_code=3)], listening="uid-1")
    assert ended.phase is P.FAILED


@pytest.mark.parametrize(
    ("head", "endpoint"),
    [
        pytest.param(pod("Running", ip="127.10.3.4"), ("127.10.3.4", 50100), id="started"),
        pytest.param(pod("Running", ready=True), None, id="ready-its-probe-speaks"),
        pytest.param(pod("Running", deleting=True), None, id="being-deleted"),
        pytest.param(pod("Running", ip=""), None, id="no-ip-yet"),
        pytest.param(pod(gated=True), None, id="gated"),
        pytest.param(pod("Running", waiting=("ContainerCreating", "")), None, id="not-started"),
        pytest.param(pod("Failed", exit_code=1), None, id="ended"),
    ],
)
def test_kernel_endpoint(head: dict[str, Any], endpoint: tuple[str, int] | None) -> None:
    assert kernel_endpoint(head) == endpoint


def test_a_replacement_made_in_the_second_its_parked_head_ended_is_the_head() -> None:
    """A kernel parked and woken within one second: its old head pod ended (Failed, 143) and
    was written to after its replacement was made, so its resourceVersion is the higher one,
    and creationTimestamp counts whole seconds. The replacement round (`-head-1`) is the head:
    read from the old pod, the woken kernel was told 'the kernel ended' (2 runs in 16 of the
    park test with expired watches, on the fake plane)."""
    old = pod("Failed", exit_code=143)
    old["metadata"]["resourceVersion"] = "120"
    new = pod()  # ungated once Kueue admitted the woken Workload; starting
    new["metadata"] |= {"name": "kq-1-head-1", "resourceVersion": "95"}
    for pods in ([old, new], [new, old]):
        status = group_status(workload(*ADMITTED), pods, was_running=True)
        assert (status.phase, status.message) == (P.ADMITTED, "")


def test_a_head_kueue_stopped_is_no_end_of_the_kernel_while_its_replacement_is_not_listed() -> None:
    """A woken (or requeued and admitted) group whose replacement the pod cache has not listed
    yet: the only head is the one Kueue's eviction stopped (TerminationTarget), which is not
    the kernel ending. The park test with expired watches went parked -> finished ('the kernel
    ended') about 1 run in 17 on the fake plane."""
    stopped = pod("Failed", exit_code=143)
    stopped["status"]["conditions"].append(
        cond("TerminationTarget", reason="WorkloadEvictedDueToDeactivated")
    )
    status = group_status(workload(*ADMITTED), [stopped], was_running=True)
    assert status.phase is P.ADMITTED
    # a head that ended by itself is still the kernel's end
    crashed = group_status(workload(*ADMITTED), [pod("Failed", exit_code=1)], was_running=True)
    assert (crashed.phase, crashed.message) == (P.FINISHED, "the kernel ended with exit code 1")
