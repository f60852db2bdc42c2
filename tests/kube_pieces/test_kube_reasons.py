"""Table tests of what a waiting kernel's reason says of Kueue's conditions: the granular
QuotaReserved reasons (Kueue 0.20's default) and the older `Pending`, `Inadmissible` and
`Waiting` with their messages (0.14 to 0.19), each taken from Kueue's own wording."""

from __future__ import annotations

from typing import Any

import pytest

from kernel_queue.kube.queueing.reasons import Queue, Reason, explain, local_queue_active, parse

KEYS = {"nvidia.com/gpu": "gpus", "cpu": "cpu", "memory": "memory"}
QUEUE = Queue("user-queue", "gpu-cq")
SHORT = (
    "couldn't assign flavors to pod set 3c9d1f0a: insufficient unused quota for nvidia.com/gpu "
    "in flavor default-flavor, 1 more needed"
)
MAX_NOW = (  # 0.14.8 and later
    "couldn't assign flavors to pod set 3c9d1f0a: insufficient quota for nvidia.com/gpu in "
    "flavor default-flavor, previously considered podsets requests (0) + current podset request "
    "(3) > maximum capacity (2)"
)
MAX_BEFORE = (  # 0.11 to 0.14.x
    "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor "
    "default-flavor, request > maximum capacity (3 > 2)"
)
NEVER = (
    "asks for 3 nvidia.com/gpu but ClusterQueue 'gpu-cq' can never give more than 2, so it "
    "could never start. Ask for fewer `gpus` in the kernelspec, or use a `queue` whose "
    "ClusterQueue has more."
)
NEVER_FITS = Reason(never=NEVER, has={"gpus": 2})
"""Failed at once, with what the queue could ever give (the status event's `has`)."""
WAITING_ONE_GPU = "waiting for 1 more nvidia.com/gpu to free up in ClusterQueue 'gpu-cq'"
PODS_READY = (
    "Kueue admits nothing until the pods of the workloads it admitted are ready (waitForPodsReady)"
)


def workload(
    reason: str | None = None, message: str = "", *, active: bool = True, **extra: Any
) -> dict[str, Any]:
    conditions = []
    if reason is not None:
        conditions.append(
            {"type": "QuotaReserved", "status": "False", "reason": reason, "message": message}
        )
    conditions += extra.get("conditions", [])
    return {
        "metadata": {"name": "kq-1a2b"},
        "spec": {"queueName": "user-queue", "active": active},
        "status": {"conditions": conditions},
    }


@pytest.mark.parametrize(
    ("wl", "expected"),
    [
        pytest.param(
            workload("WaitingForQuota", SHORT),
            Reason(WAITING_ONE_GPU, estimable=True),
            id="0.20-waiting-for-quota",
        ),
        pytest.param(
            workload("Pending", SHORT),
            Reason(WAITING_ONE_GPU, estimable=True),
            id="0.19-pending-insufficient-unused-quota",
        ),
        pytest.param(
            workload(
                "Pending",
                "couldn't assign flavors to pod set main: insufficient unused quota for cpu in "
                "flavor default-flavor, 2 more needed, insufficient unused quota for "
                "nvidia.com/gpu in flavor default-flavor, 1 more needed",
            ),
            Reason(
                "waiting for 2 more cpu and 1 more nvidia.com/gpu to free up in ClusterQueue "
                "'gpu-cq'",
                estimable=True,
            ),
            id="two-resources-short",
        ),
        pytest.param(
            workload(
                "WaitingForQuota",
                "couldn't assign flavors to pod set main: insufficient unused quota for "
                "nvidia.com/gpu in flavor a100, 1 more needed, insufficient unused quota for "
                "nvidia.com/gpu in flavor h100, 2 more needed",
            ),
            Reason(
                "waiting for 1 more nvidia.com/gpu in flavor 'a100' or 2 more nvidia.com/gpu in "
                "flavor 'h100' to free up in ClusterQueue 'gpu-cq'",
                estimable=True,
            ),
            id="short-in-either-flavor",
        ),
        pytest.param(
            workload("Pending", SHORT + ". Pending the preemption of 1 workload(s)"),
            Reason(
                WAITING_ONE_GPU + "; 1 workload is being preempted to make room", estimable=True
            ),
            id="0.19-pending-the-preemption",
        ),
        pytest.param(
            workload(
                "WaitingForPreemptedWorkloads", SHORT + ". Pending the preemption of 2 workload(s)"
            ),
            Reason(
                WAITING_ONE_GPU + "; 2 workloads are being preempted to make room",
                estimable=True,
            ),
            id="0.20-waiting-for-preempted-workloads",
        ),
        pytest.param(workload("ExceedsMaxQuota", MAX_NOW), NEVER_FITS, id="0.20-exceeds-max-quota"),
        pytest.param(workload("Pending", MAX_NOW), NEVER_FITS, id="0.19-maximum-capacity"),
        pytest.param(workload("Pending", MAX_BEFORE), NEVER_FITS, id="0.14-request-gt-maximum"),
        pytest.param(
            workload(
                "Pending",
                "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu "
                "in flavor a100, previously considered podsets requests (0) + current podset "
                "request (3) > maximum capacity (2), insufficient unused quota for "
                "nvidia.com/gpu in flavor h100, 1 more needed",
            ),
            Reason(WAITING_ONE_GPU, estimable=True),
            id="too-big-for-one-flavor-but-fits-another",
        ),
        pytest.param(
            workload(
                "Pending",
                "couldn't assign flavors to pod set main: insufficient quota for memory in "
                "flavor default-flavor, previously considered podsets requests (0) + current "
                "podset request (48Gi) > maximum capacity (32Gi)",
            ),
            Reason(
                never="asks for 48Gi memory but ClusterQueue 'gpu-cq' can never give more than "
                "32Gi, so it could never start. Lower `memory` in the kernelspec, or use a "
                "`queue` whose ClusterQueue has more.",
                has={"memory": "32Gi"},
            ),
            id="memory-too-big",
        ),
        pytest.param(
            workload(
                "ExceedsMaxQuota",
                "couldn't assign flavors to pod set head: insufficient quota for nvidia.com/gpu "
                "in flavor default-flavor, previously considered podsets requests (2) + current "
                "podset request (1) > maximum capacity (2)",
            ),
            NEVER_FITS,
            id="pod-sets-add-up",
        ),
        pytest.param(
            workload(
                "NoMatchingFlavor",
                "couldn't assign flavors to pod set main: resource nvidia.com/gpu unavailable in "
                "ClusterQueue",
            ),
            Reason(
                never="asks for nvidia.com/gpu but ClusterQueue 'gpu-cq' has no quota for "
                "nvidia.com/gpu, so it could never start. Use a `queue` whose ClusterQueue "
                "covers nvidia.com/gpu, or ask the cluster's admin to add it.",
                has={"gpus": 0},
            ),
            id="resource-not-covered",
        ),
        pytest.param(
            workload(
                "NoMatchingFlavor",
                "couldn't assign flavors to pod set main: flavor a100 doesn't match node affinity",
            ),
            Reason(
                "waiting for quota in ClusterQueue 'gpu-cq': couldn't assign flavors to pod set "
                "main: flavor a100 doesn't match node affinity",
                estimable=True,
            ),
            id="no-matching-flavor-says-kueue's-words",
        ),
        pytest.param(
            workload(
                "WaitingForPodsReady",
                "waiting for all admitted workloads to be in PodsReady condition",
            ),
            Reason(PODS_READY, estimable=True),
            id="0.20-waiting-for-pods-ready",
        ),
        pytest.param(
            workload("Waiting", "waiting for all admitted workloads to be in PodsReady condition"),
            Reason(PODS_READY, estimable=True),
            id="0.19-waiting",
        ),
        pytest.param(
            workload("Misconfigured", "ClusterQueue gpu-cq doesn't exist"),
            Reason(
                "ClusterQueue 'gpu-cq' of LocalQueue 'user-queue' does not exist; ask the "
                "cluster's admin to create it, or use another `queue`"
            ),
            id="0.20-misconfigured-cluster-queue-missing",
        ),
        pytest.param(
            workload("Inadmissible", "ClusterQueue gpu-cq is terminating or missing"),
            Reason(
                "ClusterQueue 'gpu-cq' of LocalQueue 'user-queue' does not exist; ask the "
                "cluster's admin to create it, or use another `queue`"
            ),
            id="0.19-inadmissible-cluster-queue-missing",
        ),
        pytest.param(
            workload("Pending", "ClusterQueue gpu-cq not found"),
            Reason(
                "ClusterQueue 'gpu-cq' of LocalQueue 'user-queue' does not exist; ask the "
                "cluster's admin to create it, or use another `queue`"
            ),
            id="0.14-pending-cluster-queue-not-found",
        ),
        pytest.param(
            workload("Suspended", "ClusterQueue gpu-cq is stopped"),
            Reason(
                "ClusterQueue 'gpu-cq' is stopped: it admits nothing until the cluster's admin "
                "restarts it"
            ),
            id="0.20-suspended-cluster-queue-stopped",
        ),
        pytest.param(
            workload("Pending", "ClusterQueue gpu-cq is inactive"),
            Reason(
                "ClusterQueue 'gpu-cq' is inactive: it admits nothing until the cluster's admin "
                "fixes it"
            ),
            id="0.19-pending-cluster-queue-inactive",
        ),
        pytest.param(
            workload("Inadmissible", "LocalQueue user-queue is stopped"),
            Reason(
                "LocalQueue 'user-queue' is stopped: it admits nothing until the cluster's admin "
                "restarts it"
            ),
            id="0.19-inadmissible-local-queue-stopped",
        ),
        pytest.param(
            workload("Misconfigured", "LocalQueue user-queue doesn't exist"),
            Reason("LocalQueue 'user-queue' does not exist; use another `queue`"),
            id="0.20-misconfigured-local-queue-missing",
        ),
        pytest.param(
            workload("Misconfigured", "workload namespace doesn't match ClusterQueue selector"),
            Reason("Kueue cannot admit it: workload namespace doesn't match ClusterQueue selector"),
            id="misconfigured-in-kueue's-words",
        ),
        pytest.param(
            workload("AdmissionGated", "gated by example.com/check"),
            Reason("held by an admission gate: gated by example.com/check"),
            id="admission-gated",
        ),
        pytest.param(
            workload("Pending", "Preempted to accommodate a workload (UID: 9a1e, JobUID: UNKNOWN)"),
            Reason(estimable=True),
            id="0.19-pending-after-an-eviction-says-nothing-more",
        ),
        pytest.param(
            workload("PendingEvaluation", "Workload is pending evaluation in the scheduling queue"),
            Reason(estimable=True),
            id="0.20-pending-evaluation-says-nothing-more",
        ),
        pytest.param(workload(), Reason(estimable=True), id="no-condition-yet"),
        pytest.param(
            workload(
                "Pending",
                "Preempted to accommodate a workload",
                active=False,
                conditions=[
                    {
                        "type": "Evicted",
                        "status": "True",
                        "reason": "DeactivatedDueToRequeuingLimitExceeded",
                        "message": "The workload is deactivated due to exceeding the maximum "
                        "number of re-queuing retries",
                    }
                ],
            ),
            Reason(
                "its Workload kq-1a2b is deactivated (spec.active is false: The workload is "
                "deactivated due to exceeding the maximum number of re-queuing retries); Kueue "
                "keeps it out of the queue until it is active again"
            ),
            id="deactivated-by-kueue",
        ),
    ],
)
def test_what_kueue_says_of_a_waiting_workload(wl: dict[str, Any], expected: Reason) -> None:
    assert explain(wl, queue=QUEUE, keys=KEYS) == expected


def test_before_the_local_queue_is_read_the_cluster_queue_is_named_by_it() -> None:
    unknown = Queue("user-queue")
    assert explain(workload("WaitingForQuota", SHORT), queue=unknown, keys=KEYS) == Reason(
        "waiting for 1 more nvidia.com/gpu to free up", estimable=True
    )
    never = explain(workload("ExceedsMaxQuota", MAX_NOW), queue=unknown, keys=KEYS).never
    assert never.startswith(
        "asks for 3 nvidia.com/gpu but the ClusterQueue of LocalQueue 'user-queue' can never "
        "give more than 2"
    )


def test_an_unnamed_resource_points_at_the_pod_template() -> None:
    message = MAX_NOW.replace("nvidia.com/gpu", "example.com/fpga")
    never = explain(workload("ExceedsMaxQuota", message), queue=QUEUE, keys=KEYS).never
    assert "Lower its example.com/fpga request (`pod_template` in the kernelspec)" in never


LQ_ACTIVE = {"type": "Active", "status": "True", "reason": "Ready"}


@pytest.mark.parametrize(
    ("active", "workload_says", "expected"),
    [
        pytest.param(
            ("False", "ClusterQueueDoesNotExist", "Can't submit new workloads to clusterQueue"),
            ("Inadmissible", "ClusterQueue gpu-cq is terminating or missing"),
            "LocalQueue 'user-queue' is inactive (ClusterQueueDoesNotExist): its ClusterQueue "
            "'gpu-cq' does not exist; ask the cluster's admin to create it, or use another "
            "`queue`",
            id="cluster-queue-missing",
        ),
        pytest.param(
            ("False", "ClusterQueueIsInactive", "Can't submit new workloads to clusterQueue"),
            ("Suspended", "ClusterQueue gpu-cq is stopped"),
            "LocalQueue 'user-queue' is inactive (ClusterQueueIsInactive): its ClusterQueue "
            "'gpu-cq' is stopped or inactive and admits nothing until the cluster's admin "
            "restarts it",
            id="cluster-queue-stopped",
        ),
        pytest.param(
            ("False", "Stopped", "LocalQueue is stopped"),
            None,
            "LocalQueue 'user-queue' is stopped (Stopped): it admits nothing until the "
            "cluster's admin restarts it",
            id="local-queue-stopped-before-the-workload-says-so",
        ),
    ],
)
def test_an_inactive_local_queue_is_named_with_kueue_s_reason(
    active: tuple[str, str, str], workload_says: tuple[str, str] | None, expected: str
) -> None:
    queue = Queue("user-queue", "gpu-cq", active)
    wl = workload(*workload_says) if workload_says else workload()
    assert explain(wl, queue=queue, keys=KEYS) == Reason(expected)


def test_fresh_quota_news_from_the_workload_wins_over_an_older_local_queue_read() -> None:
    queue = Queue("user-queue", "gpu-cq", ("False", "Stopped", "LocalQueue is stopped"))
    assert explain(workload("WaitingForQuota", SHORT), queue=queue).why == WAITING_ONE_GPU


def test_the_local_queue_s_active_condition_is_read_from_its_status() -> None:
    lq = {"status": {"conditions": [{**LQ_ACTIVE, "message": "Can submit new workloads"}]}}
    assert local_queue_active(lq) == ("True", "Ready", "Can submit new workloads")
    assert local_queue_active({"status": {}}) is None
    assert local_queue_active(None) is None


@pytest.mark.parametrize(
    ("wl", "positioned", "waited", "expected"),
    [
        pytest.param(None, False, 29.0, Reason(), id="no-workload-yet"),
        pytest.param(
            None,
            False,
            30.0,
            Reason(
                "no Workload for the kernel's pods after 30 s: is Kueue's controller running in "
                "the cluster?",
                answered=False,
            ),
            id="no-workload-after-the-bound",
        ),
        pytest.param(
            workload(),
            False,
            31.0,
            Reason(
                "Kueue has not looked at the kernel's Workload kq-1a2b after 30 s (no condition "
                "on it, no queue position): is Kueue's controller running in the cluster?",
                answered=False,
            ),
            id="a-workload-kueue-never-looked-at",
        ),
        pytest.param(
            workload(), True, 31.0, Reason(estimable=True), id="placed-behind-a-strict-fifo-head"
        ),
        pytest.param(
            workload("Pending", SHORT),
            False,
            600.0,
            Reason(WAITING_ONE_GPU, estimable=True),
            id="kueue-answered",
        ),
    ],
)
def test_a_kueue_that_does_not_answer_is_named_after_the_bound(
    wl: dict[str, Any] | None, positioned: bool, waited: float, expected: Reason
) -> None:
    assert explain(wl, queue=QUEUE, positioned=positioned, waited=waited, within=30.0) == expected


def test_no_bound_never_says_kueue_is_silent() -> None:
    assert explain(None, queue=QUEUE, waited=1e6, within=0.0) == Reason()


def test_parse_takes_the_flavor_assigner_message_apart() -> None:
    parsed = parse(MAX_BEFORE)
    assert parsed.maximum == (("nvidia.com/gpu", "default-flavor", "3", "2"),)
    assert (parsed.short, parsed.unavailable, parsed.preempting, parsed.other) == ((), (), 0, False)


def test_a_group_that_never_fits_names_pod_group_size_in_the_fix() -> None:
    """Two pods of 1 GPU under a ClusterQueue of 1: `gpus` already asks for 1; the fix names
    the group's size too."""
    keys = {**KEYS, "pod_group_size": "2"}
    message = (
        "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in "
        "flavor default-flavor, request > maximum capacity (2 > 1)"
    )
    never = explain(workload("Pending", message), queue=QUEUE, keys=keys).never
    assert never == (
        "asks for 2 nvidia.com/gpu but ClusterQueue 'gpu-cq' can never give more than 1, so it "
        "could never start. Ask for fewer `gpus` per pod, or a smaller `pod_group_size` (now 2 "
        "pods), in the kernelspec, or use a `queue` whose ClusterQueue has more."
    )


def test_a_groups_needs_count_the_whole_group() -> None:
    from dataclasses import replace

    from tests.kube_pieces.specs import SPEC

    assert replace(SPEC, gpus=1, pod_group_size=1, cpu=None, memory=None).needs() == "1 GPU"
    group = replace(SPEC, gpus=1, pod_group_size=2, cpu=None, memory=None)
    assert group.needs() == "2 GPUs: 2 pods of 1 GPU"
    assert replace(group, cpu="4").needs() == "2 GPUs: 2 pods of 1 GPU, 4 CPU"
    assert replace(group, gpus=0, cpu="4").needs() == "2 pods of 4 CPU"  # not "0 GPUs: …"
    assert replace(group, gpus=0).needs() == "2 pods, no GPU"
