"""What the gateway tests read from the fake cluster and the gateway log while a kernel waits."""

from __future__ import annotations

from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue import model
from tests.gateway.gateways import GatewayProcess
from tests.polling import until

KERNEL_ID_LABEL = "kernel-queue.dev/kernel-id"


def uids(cluster: FakeCluster, kernel_id: str) -> dict[str, list[str]]:
    """`metadata.uid`s of what `tests.kube.support.labelled` names (pods, Services, Secrets, the
    kernel's Workloads), by plural: an object deleted and recreated under its name shows here."""
    found: dict[str, list[str]] = {}
    for plural in ("pods", "services", "secrets"):
        items, _ = cluster.store.list_objects(
            "", plural, "default", labels=f"{KERNEL_ID_LABEL}={kernel_id}"
        )
        found[plural] = sorted(i["metadata"]["uid"] for i in items)
    if ("kueue.x-k8s.io", "workloads") in cluster.store.types:
        workloads, _ = cluster.store.list_objects("kueue.x-k8s.io", "workloads", "default")
        prefix = model.group_name(kernel_id)
        found["workloads"] = sorted(
            w["metadata"]["uid"] for w in workloads if w["metadata"]["name"].startswith(prefix)
        )
    return {k: v for k, v in found.items() if v}


def gated_kernels(cluster: FakeCluster) -> set[str]:
    """Ids of kernels whose pods Kueue still holds (scheduling gates on, not admitted)."""
    pods, _ = cluster.store.list_objects("", "pods", "default", labels=KERNEL_ID_LABEL)
    return {
        p["metadata"]["labels"][KERNEL_ID_LABEL]
        for p in pods
        if p["spec"].get("schedulingGates") and not p["metadata"].get("deletionTimestamp")
    }


def position_reads(cluster: FakeCluster) -> int:
    """How many times the server has read a LocalQueue's pending Workloads (the queue positions)."""
    return cluster.stats.requests[("get", "localqueues/pendingworkloads")]


async def requeued_and_kept_active(gateway: GatewayProcess, kernel: str) -> None:
    """Wait until the gateway's log shows the preempted `kernel` back in the queue, then check
    that it stays active meanwhile: the restarter polls every 3 s and each poll refreshes the
    kernel's last_activity, so the gateway's culler never sees it idle."""
    await until(
        lambda: (
            f"kernel {kernel[:8]}: preempted; requeued in 'user-queue', position 1 of 1"
            in gateway.log()
        ),
        "the preempted kernel back in the queue",
    )
    before = (await gateway.kernel_model(kernel))["last_activity"]

    async def refreshed() -> bool:
        return bool((await gateway.kernel_model(kernel))["last_activity"] > before)

    await until(refreshed, "the requeued kernel's last_activity refreshed by a poll", within=15)
