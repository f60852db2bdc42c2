"""Fixtures of the kubernetes-backend tests: a fake cluster enforcing etc/kubernetes/rbac.yaml
with etc/kubernetes/queues.yaml, and the test server's kubernetes backend pointed at it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.serverapp import ServerApp
from kernel_queue_fake_cluster.apiserver import rbac
from kernel_queue_fake_cluster.cluster import FakeCluster

from tests.conftest import KUEUE_CRDS, skip_unless_ci
from tests.kube.support import ADMIN_TOKEN, GPU_QUOTA, OWNER, QUEUES, RBAC, SERVER_TOKEN


@pytest.fixture
def cluster_options() -> dict[str, Any]:
    """Extra FakeCluster arguments; override in a test module or with parametrize."""
    return {}


@pytest.fixture
def cluster(
    tmp_path: Path, jp_asyncio_loop: asyncio.AbstractEventLoop, cluster_options: dict[str, Any]
) -> Iterator[FakeCluster]:
    """A fake cluster enforcing etc/kubernetes/rbac.yaml, with etc/kubernetes/queues.yaml."""
    if not KUEUE_CRDS.exists():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_CRDS} (../shared is absent)")
    tokens = {
        ADMIN_TOKEN: rbac.User("admin", ("system:masters",)),
        SERVER_TOKEN: "system:serviceaccount:default:kernel-queue",
    }
    policy = [doc for doc in RBAC if doc["apiVersion"].startswith("rbac.")]
    options = {"tokens": tokens, "rbac_objects": policy, **cluster_options}
    fake = FakeCluster(root_dir=tmp_path / "cluster", **options)
    jp_asyncio_loop.run_until_complete(fake.start())
    if options.get("crds") is not False:
        fake.apply(fake.for_release(QUEUES))
        assert fake.kueue is not None
        fake.kueue.set_quota("cluster-queue", "default-flavor", GPU_QUOTA)
    yield fake
    # The server's own clean-up runs after this fixture's: stop its kernels while the cluster
    # still answers, so nothing is left half-deleted and no client retries a closed port.
    if ServerApp.initialized():
        jp_asyncio_loop.run_until_complete(ServerApp.instance().kernel_manager.shutdown_all())
    jp_asyncio_loop.run_until_complete(fake.stop())


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {}


@pytest.fixture
def backend_config() -> dict[str, Any]:
    """Extra `c.KubernetesBackend` settings; override in a test module or with parametrize."""
    return {}


@pytest.fixture
def jp_server_config(
    jp_server_config: dict[str, Any], cluster: FakeCluster, backend_config: dict[str, Any]
) -> dict[str, Any]:
    kubeconfig = cluster.kubeconfig_for(SERVER_TOKEN, name="server-kubeconfig")
    jp_server_config["KubernetesBackend"] = {
        "kubeconfig": str(kubeconfig),
        "namespace": "default",
        "position_interval": 0.2,
        "owner_id": OWNER,
        "reap_interval": 1.0,
        **backend_config,
    }
    return jp_server_config
