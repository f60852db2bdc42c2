"""Fixtures of the kubernetes-backend tests, on two planes (`tests/kube/planes.py`).

`plane`: a test that takes it runs on the fake cluster and on the real control plane (real
kube-apiserver, etcd, scheduler, controller manager and Kueue, and the node agent; built from Go
modules by `scripts/control-plane build`), ids `fake-0.19` and `real-0.19`. `cluster`: a
`FakeCluster`, for a test that needs what only the fake has. Both enforce
etc/kubernetes/rbac.yaml for the server, with etc/kubernetes/queues.yaml and `GPU_QUOTA`.

The suite runs on Kueue 0.19; a representative `SUBSET` of it (start, queue position, cancel,
preemption and resume, a failure sentence, clean-up) also runs once per release: on the fake
each of `SUBSET_RELEASES` (each with that release's CRDs, `RELEASE_CRDS`), on the real plane
each of `REAL_RELEASES` (each release built from its own module).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.apiserver import rbac
from kernel_queue_fake_cluster.cluster import FakeCluster
from kernel_queue_fake_cluster.control_plane.fault_proxy import FaultProxy

from tests.conftest import KUEUE_CRDS, KUEUE_DATA, real_plane_ready, skip_unless_ci
from tests.contract import Contract
from tests.kube import images, parking
from tests.kube.planes import FakePlane, Plane, RealPlane, RealPlanes, stop_kernels
from tests.kube.support import (
    ADMIN_TOKEN,
    COPIED_LABELS,
    GPU_QUOTA,
    OWNER,
    PVC,
    QUEUES,
    RBAC,
    SERVER_TOKEN,
)

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
    (
        "test_kube_park.py",
        "test_a_parked_kernel_gives_its_gpu_to_the_waiting_one_and_comes_back_restored",
    ),
    (
        "test_kube_queues.py",
        "test_the_queue_counts_its_own_kernels_and_never_names_another_users_workload",
    ),
}
"""Start, queue position and the waiting reason; cancel of a queued kernel; preemption, requeue
and resume; a request never admissible failing at once in a sentence; parking (spec.active) and
waking with the checkpoint restored; the queue listing's counts from each release's LocalQueue
status (v1beta1's flavorUsage, v1beta2's flavorsUsage); and, in each, nothing left in the
cluster."""
RELEASE_CRDS = {"0.14": KUEUE_DATA / "v0.14" / "crds", "0.19": KUEUE_CRDS, "0.20": KUEUE_CRDS}
"""Each release's CRDs: 0.14's own, main's (0.19) for 0.19 and for 0.20, which drops v1beta1."""


REAL_RELEASES: tuple[str, ...] = ("0.14", "0.19")
"""The Kueue releases the real plane runs the `SUBSET` on (the newest the Go module proxy
serves, and the oldest v1beta1-only one; see control_plane/releases.py)."""
DEFAULT_RELEASE = "0.19"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes `plane` runs on both planes; a test of the `SUBSET` once per release
    of each plane (`SUBSET_RELEASES`, `REAL_RELEASES`). A fake-only test of the `SUBSET` runs
    once per release of `SUBSET_RELEASES` (its `cluster_options` are `{"kueue": release}`)."""
    subset = (metafunc.definition.path.name, metafunc.function.__name__) in SUBSET
    if "plane" in inspect.signature(metafunc.function).parameters:
        fake = SUBSET_RELEASES if subset else (DEFAULT_RELEASE,)
        real = REAL_RELEASES if subset else (DEFAULT_RELEASE,)
        specs = [("fake", r) for r in fake] + [("real", r) for r in real]
        ids = [f"{kind}-{release}" for kind, release in specs]
        metafunc.parametrize("plane", specs, ids=ids, indirect=True)
    elif subset:
        options = [{"kueue": release} for release in SUBSET_RELEASES]
        ids = [f"kueue-{release}" for release in SUBSET_RELEASES]
        metafunc.parametrize("cluster_options", options, ids=ids)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In one process (`-n 0`), tests on the real plane run last, those of one release together
    (one plane at a time, started once; by then a background build of it has had the most
    time); on xdist workers they are one unit of work (tests/conftest.py). A
    `SUBSET` entry naming no test of its module is an error, not a test that silently stopped
    running on every release."""

    def order(item: pytest.Item) -> tuple[int, str]:
        callspec = getattr(item, "callspec", None)
        kind, release = (callspec.params.get("plane") if callspec else None) or ("fake", "")
        return (0, "") if kind == "fake" else (1, "" if release == DEFAULT_RELEASE else release)

    items.sort(key=order)  # stable: the order within each group stays
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
    fake = _fake_cluster(tmp_path, jp_asyncio_loop, cluster_options)
    yield fake
    stop_kernels(jp_asyncio_loop)
    jp_asyncio_loop.run_until_complete(fake.stop())


@pytest.fixture
def plane(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    jp_asyncio_loop: asyncio.AbstractEventLoop,
    cluster_options: dict[str, Any],
) -> Iterator[Plane]:
    """The plane a test runs on (`pytest_generate_tests` parametrizes it): the fake cluster, or
    a real control plane brought back to its first state with a `FaultProxy` of this test's
    in front of it."""
    kind, release = getattr(request, "param", ("fake", DEFAULT_RELEASE))
    if kind == "fake":
        options = {**cluster_options, "kueue": release}
        fake = _fake_cluster(tmp_path, jp_asyncio_loop, options)
        yield FakePlane(fake, SERVER_TOKEN)
        stop_kernels(jp_asyncio_loop)
        jp_asyncio_loop.run_until_complete(fake.stop())
        return
    real_plane_ready()
    planes: RealPlanes = request.getfixturevalue("real_planes")
    control = planes.plane(release)
    token = planes.server_token(release)
    proxy = jp_asyncio_loop.run_until_complete(FaultProxy(control.url, control.pki.ca.cert).start())
    try:  # a reset or a kernel's stop that fails still closes the proxy's connections
        real = RealPlane(control, proxy, token)
        real.reset()
        yield real
        stop_kernels(jp_asyncio_loop)
    finally:
        jp_asyncio_loop.run_until_complete(proxy.stop())


def _fake_cluster(
    tmp_path: Path, loop: asyncio.AbstractEventLoop, cluster_options: dict[str, Any]
) -> FakeCluster:
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
    options = {"label_keys_to_copy": COPIED_LABELS, **options}
    fake = FakeCluster(root_dir=tmp_path / "cluster", **options)
    loop.run_until_complete(fake.start())
    if fake.kubelet is not None:  # as every real plane's node: a registry without them
        fake.kubelet.fail_image(image=images.MISSING_IMAGE)
    if options.get("crds") is not False:
        fake.apply(fake.for_release(QUEUES))
        assert fake.kueue is not None
        fake.kueue.set_quota("cluster-queue", "default-flavor", GPU_QUOTA)
    return fake


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {}


@pytest.fixture
def backend_config() -> dict[str, Any]:
    """Extra `c.KubernetesBackend` settings; override in a test module or with parametrize."""
    return {}


@pytest.fixture
def jp_server_config(
    request: pytest.FixtureRequest,
    jp_server_config: dict[str, Any],
    tmp_path: Path,
    backend_config: dict[str, Any],
) -> dict[str, Any]:
    """The server's kubernetes backend on the test's plane (or fake cluster), with the
    credentials etc/kubernetes/rbac.yaml grants it."""
    if "plane" in request.fixturenames:
        plane: Plane = request.getfixturevalue("plane")
        kubeconfig = plane.server_kubeconfig(tmp_path)
    else:
        cluster: FakeCluster = request.getfixturevalue("cluster")
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
    tested = parking.contract(parking.backend(plane, tmp_path, **backend_settings))
    yield tested
    jp_asyncio_loop.run_until_complete(tested.aclose())
