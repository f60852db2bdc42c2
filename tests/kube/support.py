"""Helpers shared by the kubernetes-backend tests (their fixtures are in conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue import model
from tests.conftest import KernelspecFactory, Server

REPO = Path(__file__).resolve().parents[2]
RBAC = list(yaml.safe_load_all((REPO / "etc" / "kubernetes" / "rbac.yaml").read_text()))
QUEUES = (REPO / "etc" / "kubernetes" / "queues.yaml").read_text()
SERVER_TOKEN = "kernel-queue-server-token"
ADMIN_TOKEN = "admin-token"
GPU_QUOTA: dict[str, str | int] = {"cpu": 8, "memory": "32Gi", "nvidia.com/gpu": 1}
CLAIM = "kernel-checkpoints"
"""The checkpoint claim the kube tests' kernels save to (made with `PVC`)."""


def pvc(name: str) -> str:
    """A ReadWriteMany PersistentVolumeClaim `name` in namespace default, as YAML."""
    return f"""
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}, namespace: default}}
spec:
  accessModes: [ReadWriteMany]
  resources: {{requests: {{storage: 10Gi}}}}
"""


PVC = pvc(CLAIM)
CHECKPOINT = {"enabled": True, "claim": CLAIM, "grace_seconds": 30}

OURS = "app.kubernetes.io/managed-by=kernel-queue"
OWNER = "test-server"
COPIED_LABELS = ("kernel-queue.dev/owner",)
"""What both planes' Kueue copies from pods onto Workloads (`labelKeysToCopy`), as the README
asks of an admin: each server then watches only its own Workloads."""
"""The test server's `c.KubernetesBackend.owner_id`."""


def kube_spec(kernelspec: KernelspecFactory, name: str = "kube", **config: Any) -> str:
    config.setdefault("backend", "kubernetes")
    config.setdefault("queue", "user-queue")
    config.setdefault("image", "kernel-queue/test-kernel")
    config.setdefault("gpus", 1)
    return kernelspec(name, **config)


def checkpointed(
    plane: Any, kernelspec: KernelspecFactory, name: str = "saved", **config: Any
) -> str:
    """A kubernetes kernelspec `name` saving its checkpoints to the claim, which is made on
    `plane` (the fake cluster or the real one)."""
    plane.apply(PVC)
    return kube_spec(kernelspec, name, checkpoint=CHECKPOINT, **config)


def _plane(where: Any) -> Any:
    """A `planes.Plane` for a plane or a bare `FakeCluster`."""
    from tests.kube.planes import FakePlane

    return FakePlane(where, SERVER_TOKEN) if isinstance(where, FakeCluster) else where


def ours(where: Any) -> dict[str, list[str]]:
    """Every pod, Service and Secret kernel-queue made, by plural (empty lists dropped);
    `where`: a plane (`planes.Plane`) or a `FakeCluster`."""
    plane = _plane(where)
    found = {}
    for plural in ("pods", "services", "secrets"):
        found[plural] = [i["metadata"]["name"] for i in plane.objects("", plural, None, OURS)]
    return {k: v for k, v in found.items() if v}


def labelled(where: Any, kernel_id: str) -> dict[str, list[str]]:
    """Objects carrying the kernel's id label, and Workloads of its groups, by plural."""
    plane = _plane(where)
    found: dict[str, list[str]] = {}
    for plural in ("pods", "services", "secrets"):
        items = plane.objects("", plural, "default", f"kernel-queue.dev/kernel-id={kernel_id}")
        found[plural] = [i["metadata"]["name"] for i in items]
    prefix = model.group_name(kernel_id)
    found["workloads"] = [
        w["metadata"]["name"]
        for w in plane.objects("kueue.x-k8s.io", "workloads", "default")
        if w["metadata"]["name"].startswith(prefix)
    ]
    return {k: v for k, v in found.items() if v}


async def wait_clean(server: Server, where: Any, *kernel_ids: str, within: float = 60) -> None:
    """Wait until nothing of these kernels is left in the cluster."""

    async def clean() -> bool:
        return not any(labelled(where, k) for k in kernel_ids)

    await server.wait_for(
        clean,
        within=within,
        what="nothing of the kernels left in the cluster",
        detail=lambda: f"objects left behind: {[labelled(where, k) for k in kernel_ids]}",
    )


async def waits_then_runs(
    server: Server, where: Any, name: str, reason: str
) -> tuple[str, str, str]:
    """Two kernels of `name` where one GPU is free: the first runs, the second waits until its
    reason holds `reason` and runs once the first is shut down; both end, and nothing of them is
    left in `where` (a plane or a `FakeCluster`). Their ids, and the reason the second waited
    with."""
    first = await server.start(name)
    assert (await server.execute(first, "1+1"))["data"] == "2"
    second = await server.start(name)
    waited = str((await server.wait_reason(second, reason))["reason"])
    await server.shutdown(first)
    assert (await server.execute(second, "2+3"))["data"] == "5"
    await server.shutdown(second)
    await wait_clean(server, where, first, second)
    return first, second, waited


LIVE_STATES = ("running", "resumed")


async def queue_entry(server: Server, kernel_id: str) -> dict[str, Any]:
    """The kernel's entry of `/api/kernel-queue/kernels` (its Jupyter model plus `queue`)."""
    response = await server.fetch("api", "kernel-queue", "kernels", method="GET")
    for entry in json.loads(response.body):
        if entry["id"] == kernel_id:
            return dict(entry)
    return {}


async def settled(server: Server, kernel_id: str, within: float = 60) -> dict[str, Any]:
    """Wait until the kernel runs or is dead; return its listing entry with `live` (bool)."""
    seen: dict[str, Any] = {}

    async def check() -> bool:
        seen.clear()
        seen.update(await queue_entry(server, kernel_id))
        state = (seen.get("queue") or {}).get("state")
        seen["live"] = state in LIVE_STATES
        return seen["live"] or seen.get("execution_state") == "dead"

    await server.wait_for(
        check,
        within=within,
        what=f"kernel {kernel_id} started or failed",
        detail=lambda: f"last entry: {seen}",
    )
    return seen


async def gone(server: Server, *kernel_ids: str, within: float = 60) -> None:
    """Wait until the kernels have left `/api/kernels`."""

    async def check() -> bool:
        return not (await server.kernel_ids()) & set(kernel_ids)

    async def still_listed() -> str:
        return f"still listed after their DELETE: {(await server.kernel_ids()) & set(kernel_ids)}"

    await server.wait_for(
        check, within=within, what="the kernels gone from /api/kernels", detail=still_listed
    )


def a_sentence(reason: str, kernel_id: str) -> bool:
    """A failure the user can act on: it names the kernel and is not the API server's raw text."""
    return f"kernel {kernel_id[:8]}" in reason and "injected fault" not in reason


async def failure(server: Server, name: str, within: float = 60) -> tuple[str, str]:
    """Start a kernel of kernelspec `name`, wait until it is dead; return its id and reason."""
    kernel, model = await server.failure(name, within)
    return kernel, str(model["reason"])
