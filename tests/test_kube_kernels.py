"""End to end on the fake cluster: real jupyter_server, the kubernetes backend over HTTP with
RBAC from etc/kubernetes/rbac.yaml, Kueue admitting pod groups, kernels run by the fake kubelet."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernel_queue.testing import rbac, resources
from kernel_queue.testing.cluster import FakeCluster
from tests.conftest import KernelspecFactory, Server

REPO = Path(__file__).resolve().parent.parent
RBAC = list(yaml.safe_load_all((REPO / "etc" / "kubernetes" / "rbac.yaml").read_text()))
QUEUES = (REPO / "etc" / "kubernetes" / "queues.yaml").read_text()
SERVER_TOKEN = "kernel-queue-server-token"
ADMIN_TOKEN = "admin-token"
GPU_QUOTA = {"cpu": 8, "memory": "32Gi", "nvidia.com/gpu": 1}


@pytest.fixture
def cluster(tmp_path: Path, jp_asyncio_loop: asyncio.AbstractEventLoop) -> Iterator[FakeCluster]:
    """A fake cluster enforcing etc/kubernetes/rbac.yaml, with etc/kubernetes/queues.yaml."""
    if not resources.KUEUE_CRDS.is_dir():
        pytest.skip(f"Kueue's CRDs are not at {resources.KUEUE_CRDS} (../shared is absent)")
    tokens = {
        ADMIN_TOKEN: rbac.User("admin", ("system:masters",)),
        SERVER_TOKEN: "system:serviceaccount:default:kernel-queue",
    }
    policy = [doc for doc in RBAC if doc["apiVersion"].startswith("rbac.")]
    fake = FakeCluster(root_dir=tmp_path / "cluster", tokens=tokens, rbac_objects=policy)
    jp_asyncio_loop.run_until_complete(fake.start())
    fake.apply(QUEUES)
    fake.kueue.set_quota("cluster-queue", "default-flavor", GPU_QUOTA)
    yield fake
    jp_asyncio_loop.run_until_complete(fake.stop())


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any], cluster: FakeCluster) -> dict[str, Any]:
    kubeconfig = cluster.kubeconfig_for(SERVER_TOKEN, name="server-kubeconfig")
    jp_server_config["KubernetesBackend"] = {
        "kubeconfig": str(kubeconfig),
        "namespace": "default",
        "position_interval": 0.2,
    }
    return jp_server_config


def kube_spec(kernelspec: KernelspecFactory, name: str = "kube", **config: Any) -> str:
    config.setdefault("backend", "kubernetes")
    config.setdefault("queue", "user-queue")
    config.setdefault("image", "kernel-queue/test-kernel")
    config.setdefault("gpus", 1)
    return kernelspec(name, **config)


def labelled(cluster: FakeCluster, kernel_id: str) -> dict[str, list[str]]:
    """Objects carrying the kernel's id label, and Workloads of its groups, by plural."""
    found: dict[str, list[str]] = {}
    for plural in ("pods", "services", "secrets"):
        items, _ = cluster.store.list_objects(
            "", plural, "default", labels=f"kernel-queue.dev/kernel-id={kernel_id}"
        )
        found[plural] = [i["metadata"]["name"] for i in items]
    workloads, _ = cluster.store.list_objects("kueue.x-k8s.io", "workloads", "default")
    prefix = f"kq-{kernel_id.replace('-', '')[:8]}"
    found["workloads"] = [
        w["metadata"]["name"] for w in workloads if w["metadata"]["name"].startswith(prefix)
    ]
    return {k: v for k, v in found.items() if v}


async def wait_clean(server: Server, cluster: FakeCluster, *kernel_ids: str) -> None:
    async def clean() -> bool:
        return not any(labelled(cluster, k) for k in kernel_ids)

    try:
        await server.wait_for(clean, within=60)
    except TimeoutError:
        pytest.fail(f"objects left behind: {[labelled(cluster, k) for k in kernel_ids]}")


async def test_a_kernel_waits_for_the_gpu_then_runs_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    name = kube_spec(kernelspec)
    first = await server.start(name)
    assert (await server.execute(first, "1+1"))["data"] == "2"
    second = await server.start(name)
    model = await server.wait_reason(second, "position 1 of 1")
    assert model["reason"] == "queued in 'user-queue', position 1 of 1, needs 1 GPU"
    await server.shutdown(first)
    assert (await server.execute(second, "2+3"))["data"] == "5"
    await server.shutdown(second)
    await wait_clean(server, cluster, first, second)
