"""Fixtures of the kubernetes-backend tests: a fake cluster enforcing etc/kubernetes/rbac.yaml
with etc/kubernetes/queues.yaml, and the test server's kubernetes backend pointed at it.

The suite runs on the fake's default Kueue release, 0.19; a representative `SUBSET` of it (start,
queue position, cancel, preemption and resume, a failure sentence, clean-up) also runs once per
release of `SUBSET_RELEASES`, each with that release's CRDs (`RELEASE_CRDS`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.serverapp import ServerApp
from kernel_queue_fake_cluster.apiserver import rbac
from kernel_queue_fake_cluster.cluster import FakeCluster

from tests.conftest import KUEUE_CRDS, KUEUE_DATA, skip_unless_ci
from tests.kube.support import ADMIN_TOKEN, GPU_QUOTA, OWNER, QUEUES, RBAC, SERVER_TOKEN

SUBSET_RELEASES: tuple[str, ...] = ("0.14", "0.19", "0.20")
"""The switch: the Kueue releases the `SUBSET` runs on, each test once per release (its id
`[kueue-0.14]`, ...). The rest of the suite runs on 0.19 only."""
SUBSET = {
    # (module, test): what of the backend it covers on every release
    ("test_kube_kernels.py", "test_a_kernel_waits_for_the_gpu_then_runs_and_leaves_nothing"),
    ("test_kube_kernels.py", "test_delete_of_a_queued_kernel_cancels_at_once_and_leaves_nothing"),
    ("test_kube_kernels.py", "test_a_higher_priority_kernel_preempts_and_the_victim_comes_back"),
    (
        "test_kube_waiting.py",
        "test_a_kernel_asking_for_more_than_the_cluster_queue_has_fails_at_once",
    ),
}
"""Start, queue position and the waiting reason; cancel of a queued kernel; preemption, requeue
and resume; a request never admissible failing at once in a sentence; and, in each, nothing left
in the cluster."""
RELEASE_CRDS = {"0.14": KUEUE_DATA / "v0.14" / "crds", "0.19": KUEUE_CRDS, "0.20": KUEUE_CRDS}
"""Each release's CRDs: 0.14's own, main's (0.19) for 0.19 and for 0.20, which drops v1beta1."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test of the `SUBSET` runs once per release of `SUBSET_RELEASES` (its
    `cluster_options` are `{"kueue": release}`)."""
    if (metafunc.definition.path.name, metafunc.function.__name__) in SUBSET:
        options = [{"kueue": release} for release in SUBSET_RELEASES]
        ids = [f"kueue-{release}" for release in SUBSET_RELEASES]
        metafunc.parametrize("cluster_options", options, ids=ids)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A `SUBSET` entry naming no test of its module is an error, not a test that silently
    stopped running on every release."""
    modules = {
        item.module.__name__: item.module for item in items if isinstance(item, pytest.Function)
    }
    for module in modules.values():
        name = Path(module.__file__ or "").name
        missing = [test for where, test in SUBSET if where == name and not hasattr(module, test)]
        if missing:
            raise pytest.UsageError(
                f"tests/kube/conftest.py SUBSET names no test {missing} of {name}"
            )


@pytest.fixture
def cluster_options() -> dict[str, Any]:
    """Extra FakeCluster arguments; override in a test module or with parametrize."""
    return {}


@pytest.fixture
def cluster(
    tmp_path: Path, jp_asyncio_loop: asyncio.AbstractEventLoop, cluster_options: dict[str, Any]
) -> Iterator[FakeCluster]:
    """A fake cluster enforcing etc/kubernetes/rbac.yaml, with etc/kubernetes/queues.yaml at
    its release's version (`cluster_options["kueue"]`: a release, with its `RELEASE_CRDS`)."""
    release = cluster_options.get("kueue")
    crds = RELEASE_CRDS[release] if isinstance(release, str) else KUEUE_CRDS
    if not crds.exists():
        skip_unless_ci(f"Kueue's CRDs are not at {crds} (../shared is absent)")
    if isinstance(release, str):
        cluster_options = {"crds": crds, **cluster_options}
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
