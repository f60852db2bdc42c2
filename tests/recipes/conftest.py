"""Fixtures of the recipe tests: a fake cluster per module that serves Kueue (main's CRDs) and
the test-only CRDs of tests/recipes/fixtures, enforces RBAC, and knows the tokens of the
service accounts the module's recipe grants; and `kubectl apply` of a rendered recipe."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from kernel_queue_fake_cluster.apiserver import rbac
from kernel_queue_fake_cluster.cluster import FakeCluster

from tests.conftest import KUEUE_CRDS, skip_unless_ci
from tests.kube.support import GPU_QUOTA, QUEUES
from tests.recipes import rendering

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ADMIN_TOKEN = "recipe-admin-token"


def crds_dir(where: Path) -> Path:
    """A directory of Kueue's CRDs beside the test-only ones (links, nothing copied)."""
    if not KUEUE_CRDS.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_CRDS} (../shared is absent)")
    where.mkdir(parents=True, exist_ok=True)
    for source in [*KUEUE_CRDS.glob("*.yaml"), *FIXTURES.glob("*.yaml")]:
        (where / source.name).symlink_to(source)
    return where


def start_cluster(root: Path, accounts: Mapping[str, str] | None) -> FakeCluster:
    """A fake cluster with the sample queues of etc/kubernetes/queues.yaml and a 1-GPU quota;
    `accounts` (token → user) turns RBAC on, with an admin token besides; None: no RBAC."""
    tokens = None
    if accounts is not None:
        tokens = {ADMIN_TOKEN: rbac.User("admin", ("system:masters",)), **accounts}
    fake = FakeCluster(root_dir=root / "cluster", crds=crds_dir(root / "crds"), tokens=tokens)
    fake.start_in_thread()
    fake.call(fake.apply, fake.for_release(QUEUES))
    assert fake.kueue is not None
    fake.call(fake.kueue.set_quota, "cluster-queue", "default-flavor", GPU_QUOTA)
    return fake


@pytest.fixture(scope="module")
def module_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recipe")


@pytest.fixture(scope="module")
def plain_cluster(module_root: Path) -> Iterator[FakeCluster]:
    """A fake cluster without RBAC, for kubectl: kubectl sends no bearer token over plain
    HTTP (client-go keeps a kubeconfig's credentials for TLS), and the fake serves HTTP."""
    fake = start_cluster(module_root / "plain", None)
    yield fake
    fake.stop_in_thread()


def kubectl_apply(cluster: FakeCluster, manifests: str, *extra: str) -> str:
    """`kubectl apply -f -` of `manifests` as an admin would, validation on (the fake serves
    the OpenAPI documents kubectl asks for, and strict field validation); its output (the test
    fails with kubectl's own error when it fails)."""
    home = Path(str(cluster.root)) / "kubectl-home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(cluster.kubeconfig)}
    done = subprocess.run(
        [rendering.kubectl(), "apply", *extra, "-f", "-"],
        input=manifests,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
