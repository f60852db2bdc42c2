"""Helpers shared by the kubernetes-backend tests (their fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kernel_queue.testing.cluster import FakeCluster
from tests.conftest import KernelspecFactory, Server

REPO = Path(__file__).resolve().parents[2]
RBAC = list(yaml.safe_load_all((REPO / "etc" / "kubernetes" / "rbac.yaml").read_text()))
QUEUES = (REPO / "etc" / "kubernetes" / "queues.yaml").read_text()
SERVER_TOKEN = "kernel-queue-server-token"
ADMIN_TOKEN = "admin-token"
GPU_QUOTA = {"cpu": 8, "memory": "32Gi", "nvidia.com/gpu": 1}
OURS = "app.kubernetes.io/managed-by=kernel-queue"


def kube_spec(kernelspec: KernelspecFactory, name: str = "kube", **config: Any) -> str:
    config.setdefault("backend", "kubernetes")
    config.setdefault("queue", "user-queue")
    config.setdefault("image", "kernel-queue/test-kernel")
    config.setdefault("gpus", 1)
    return kernelspec(name, **config)


def ours(cluster: FakeCluster) -> dict[str, list[str]]:
    """Every pod, Service and Secret kernel-queue made, by plural (empty lists dropped)."""
    found = {}
    for plural in ("pods", "services", "secrets"):
        items, _ = cluster.store.list_objects("", plural, None, labels=OURS)
        found[plural] = [i["metadata"]["name"] for i in items]
    return {k: v for k, v in found.items() if v}


def labelled(cluster: FakeCluster, kernel_id: str) -> dict[str, list[str]]:
    """Objects carrying the kernel's id label, and Workloads of its groups, by plural."""
    found: dict[str, list[str]] = {}
    for plural in ("pods", "services", "secrets"):
        items, _ = cluster.store.list_objects(
            "", plural, "default", labels=f"kernel-queue.dev/kernel-id={kernel_id}"
        )
        found[plural] = [i["metadata"]["name"] for i in items]
    if ("kueue.x-k8s.io", "workloads") in cluster.store.types:
        workloads, _ = cluster.store.list_objects("kueue.x-k8s.io", "workloads", "default")
        prefix = f"kq-{kernel_id.replace('-', '')[:8]}"
        found["workloads"] = [
            w["metadata"]["name"] for w in workloads if w["metadata"]["name"].startswith(prefix)
        ]
    return {k: v for k, v in found.items() if v}


async def wait_clean(
    server: Server, cluster: FakeCluster, *kernel_ids: str, within: float = 60
) -> None:
    """Wait until nothing of these kernels is left in the cluster."""

    async def clean() -> bool:
        return not any(labelled(cluster, k) for k in kernel_ids)

    try:
        await server.wait_for(clean, within=within)
    except TimeoutError:
        pytest.fail(f"objects left behind: {[labelled(cluster, k) for k in kernel_ids]}")
