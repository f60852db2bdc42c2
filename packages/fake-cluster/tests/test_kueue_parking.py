"""Parking a pod group as real Kueue does it, on each release the suite serves: the owner sets
the Workload's `spec.active: false` (what `kubectl kueue stop workload` writes) and later `true`.

Kueue's workload controller evicts it as `Deactivated` and drops its usage from the scheduler's
cache at once (`pkg/controller/core/workload_controller.go` Update, `!active`;
`HasActiveQuotaReservation` in `pkg/cache/scheduler/cache.go`), so a waiting Workload is admitted
while the deactivated pods still stop; the pod reconciler marks each running pod
`TerminationTarget` and deletes it with its own grace; `status.admission` goes once no pod runs
(`pkg/controller/jobframework/reconciler.go` step 6, Requeued False `Deactivated`). The
Workload stays, listed nowhere as pending, its replacement pods gated; reactivated it is
`Requeued=True, Reactivated` and queued by its creationTimestamp (`GetQueueOrderTimestamp`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kernel_queue_fake_cluster.kueue import constants as k
from test_kueue import NS, Cluster, G, cond, gates, make_cluster  # noqa: F401 - the fixture

RELEASES = ("0.14", "0.19", "0.20")


def set_active(cluster: Cluster, name: str, active: bool) -> None:
    wl = cluster.the_workload(name)
    wl["spec"]["active"] = active
    cluster.store.replace(G, "workloads", NS, name, wl)


def pending(cluster: Cluster) -> list[str]:
    found = cluster.kueue.pending_workloads_for_local_queue(NS, "user-queue")["items"]
    return [item["metadata"]["name"] for item in found]


@pytest.mark.parametrize("release", RELEASES)
async def test_parking_frees_the_quota_at_once_keeps_the_workload_and_its_place(
    make_cluster: Callable[..., Cluster],  # noqa: F811 - the fixture imported above
    release: str,
) -> None:
    cluster = make_cluster(release=release)
    cluster.queues(gpu=1)
    cluster.pod("a-0", group="a", count=1, gpu=1)
    await cluster.settle()
    cluster.run("a-0")
    cluster.pod("b-0", group="b", count=1, gpu=1)
    await cluster.settle()
    assert pending(cluster) == ["b"]

    set_active(cluster, "a", False)
    await cluster.settle()
    deactivated = "The workload is deactivated"
    parked = cluster.the_workload("a")
    assert cond(parked, k.EVICTED) == {
        "status": "True",
        "reason": "Deactivated",
        "message": deactivated,
    }
    assert [e["message"] for e in cluster.events("EvictedDueToDeactivated", "a")] == [deactivated]
    target = cond(cluster.get_pod("a-0"), k.TERMINATION_TARGET)
    assert target["reason"] == "WorkloadEvictedDueToDeactivated"
    # Kueue counts its quota no more: b is admitted while a's pod still saves and stops.
    assert cond(cluster.the_workload("b"), k.ADMITTED)["status"] == "True"
    assert cond(cluster.the_workload("a"), k.QUOTA_RESERVED)["status"] == "True"
    assert cluster.the_pod("a-0")["metadata"].get("deletionTimestamp")

    cluster.exit("a-0", 143)  # the launcher saved, then exited non-zero
    await cluster.settle()
    parked = cluster.the_workload("a")
    assert cond(parked, k.REQUEUED) == {
        "status": "False",
        "reason": "Deactivated",
        "message": deactivated,
    }
    # 0.20 names the deactivation as the reason it waits; up to 0.19 the eviction's Pending.
    assert cond(parked, k.QUOTA_RESERVED) == {
        "status": "False",
        "reason": "Deactivated" if release == "0.20" else "Pending",
        "message": deactivated,
    }
    assert "admission" not in parked["status"]
    assert cond(parked, k.FINISHED) == {}
    assert cond(parked, k.WAITING_FOR_REPLACEMENT_PODS)["status"] == "True"
    assert pending(cluster) == []

    # Its owner's replacement stays gated while it is parked; the Workload adopts it.
    cluster.pod("a-1", group="a", count=1, gpu=1)
    await cluster.settle()
    parked = cluster.the_workload("a")
    assert cond(parked, k.WAITING_FOR_REPLACEMENT_PODS)["status"] == "False"
    assert "a-1" in [ref["name"] for ref in parked["metadata"]["ownerReferences"]]
    assert gates(cluster.the_pod("a-1")) != []
    assert cluster.get_pod("a-0") is None  # the replaced pod was finalized
    assert pending(cluster) == []

    cluster.pod("c-0", group="c", count=1, gpu=1)  # a later kernel waits too
    await cluster.settle()
    assert pending(cluster) == ["c"]
    set_active(cluster, "a", True)
    await cluster.settle()
    woken = cluster.the_workload("a")
    assert cond(woken, k.REQUEUED) == {
        "status": "True",
        "reason": "Reactivated",
        "message": "The workload was reactivated",
    }
    assert pending(cluster) == ["a", "c"]  # its creation time's place: ahead of c

    cluster.store.delete(G, "workloads", NS, "b")  # b ends: a is admitted, its pod ungated
    await cluster.settle()
    assert cond(cluster.the_workload("a"), k.ADMITTED)["status"] == "True"
    assert gates(cluster.the_pod("a-1")) == []
    assert pending(cluster) == ["c"]


async def test_a_parked_group_is_not_collected_and_ends_when_its_workload_is_deleted(
    make_cluster: Callable[..., Cluster],  # noqa: F811 - the fixture imported above
) -> None:
    """Kueue collects only what it deactivated itself (`DeactivatedDueTo…`, with
    `objectRetentionPolicies.workloads.afterDeactivatedByKueue`); the owner's parked Workload
    stays until the owner deletes it, which stops and finalizes every pod."""
    cluster = make_cluster()
    cluster.queues(gpu=1)
    cluster.pod("a-0", group="a", count=1, gpu=1)
    await cluster.settle()
    cluster.run("a-0")
    set_active(cluster, "a", False)
    await cluster.settle()
    cluster.exit("a-0", 143)
    await cluster.settle()
    cluster.pod("a-1", group="a", count=1, gpu=1)
    await cluster.settle()
    assert cluster.workload("a") is not None

    cluster.store.delete(G, "workloads", NS, "a")
    await cluster.settle()
    assert cluster.workload("a") is None
    assert cluster.get_pod("a-1") is None
