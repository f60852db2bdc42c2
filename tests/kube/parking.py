"""Shared by the parking tests of the kubernetes backend: the checkpoint claim, a backend on
the test's plane as a (possibly restarted) server makes it, and running code in a group's
kernel."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel_queue.backends.kubernetes import KubernetesBackend
from kernel_queue.kube import kueue
from kernel_queue.model import GroupRef
from tests.contract import Contract, Followed, client_of
from tests.kube.planes import Plane
from tests.kube.support import OWNER

CLAIM = "kernel-checkpoints"
PVC = f"""
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {CLAIM}, namespace: default}}
spec:
  accessModes: [ReadWriteMany]
  resources: {{requests: {{storage: 10Gi}}}}
"""
CHECKPOINT = {"enabled": True, "claim": CLAIM, "grace_seconds": 30}


def backend(plane: Plane, root: Path, **settings: Any) -> KubernetesBackend:
    """The backend a server of this test makes (a second call: a restarted server), with the
    credentials etc/kubernetes/rbac.yaml grants the server; its kubeconfig goes in `root`."""
    kubeconfig = plane.server_kubeconfig(root)
    options = {"position_interval": 0.2, "owner_id": OWNER, "reap_interval": 0, **settings}
    return KubernetesBackend(kubeconfig=str(kubeconfig), namespace="default", **options)


def contract(made: KubernetesBackend) -> Contract:
    """Kernels with checkpoints to the claim, one GPU each, in `user-queue`."""
    return Contract(made, "user-queue", image="kernel-queue/test-kernel", checkpoint=CHECKPOINT)


@pytest.fixture
def backend_settings() -> dict[str, Any]:
    """Extra `KubernetesBackend` settings of the `kube` fixture's backend."""
    return {}


@pytest.fixture
def kube(
    plane: Plane,
    tmp_path: Path,
    backend_settings: dict[str, Any],
    jp_asyncio_loop: asyncio.AbstractEventLoop,
) -> Iterator[Contract]:
    """A backend on the test's plane with the checkpoint claim made."""
    plane.apply(PVC)
    tested = contract(backend(plane, tmp_path, **backend_settings))
    yield tested
    jp_asyncio_loop.run_until_complete(tested.aclose())


async def execute(ref: GroupRef, followed: Followed, code: str) -> str:
    """Run `code` in the group's kernel; what it printed."""
    address = followed.statuses[-1].address or ref.connection.ip
    client = await client_of(ref, address)
    printed: list[str] = []

    def output(message: dict[str, Any]) -> None:
        if message["header"]["msg_type"] == "stream":
            printed.append(message["content"]["text"])

    try:
        reply = await client.execute_interactive(code, timeout=60, output_hook=output)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
    return "".join(printed)


def workload(plane: Plane, name: str) -> dict[str, Any]:
    found = plane.get(kueue.KUEUE_GROUP, "workloads", "default", name)
    assert found is not None, f"no Workload {name}"
    return found
