"""What the gateway tests read from the fake cluster and the gateway log while a kernel waits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kernel_queue.testing.cluster import FakeCluster

KERNEL_ID_LABEL = "kernel-queue.dev/kernel-id"


def gated_kernels(cluster: FakeCluster) -> set[str]:
    """Ids of kernels whose pods Kueue still holds (scheduling gates on, not admitted)."""
    pods, _ = cluster.store.list_objects("", "pods", "default", labels=KERNEL_ID_LABEL)
    return {
        p["metadata"]["labels"][KERNEL_ID_LABEL]
        for p in pods
        if p["spec"].get("schedulingGates") and not p["metadata"].get("deletionTimestamp")
    }


async def wait_until(check: Callable[[], object], what: str, within: float = 60) -> object:
    """Poll `check` (cluster state, a log) until it returns something truthy."""
    try:
        async with asyncio.timeout(within):
            while not (found := check()):  # noqa: ASYNC110 - state in another process or store
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"never saw {what} within {within} s") from None
    return found
