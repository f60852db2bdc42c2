"""Kubernetes backend errors that name the fix, each on the fake cluster, each leaving nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from tests.conftest import KernelspecFactory, Server, launcher_pids
from tests.kube.support import kube_spec, labelled, ours, wait_clean

CRASHING_KERNEL = [
    "python",
    "-c",
    "import sys; print('boom: the kernel cannot start'); sys.exit(3)",
]


async def failure(server: Server, name: str, within: float = 60) -> tuple[str, str]:
    """Start a kernel of kernelspec `name`, wait until it is dead; return its id and reason."""
    kernel = await server.start(name)

    async def dead() -> bool:
        return (await server.model(kernel))["execution_state"] == "dead"

    await server.wait_for(dead, within=within)
    return kernel, str((await server.model(kernel))["reason"])


async def nothing_left(
    server: Server, cluster: FakeCluster, *kernel_ids: str, within: float = 60
) -> None:
    """Nothing of these kernels (at least one) is left, nor anything else kernel-queue made."""
    assert kernel_ids
    await wait_clean(server, cluster, *kernel_ids, within=within)
    assert ours(cluster) == {}


@pytest.mark.parametrize("cluster_options", [{"crds": False, "kueue": False}])
async def test_kueue_not_installed_says_so(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    kernel, reason = await failure(server, kube_spec(kernelspec))
    assert "the cluster serves no Kueue API" in reason
    assert "install Kueue" in reason
    await nothing_left(server, cluster, kernel)


async def test_a_missing_local_queue_lists_the_ones_that_exist(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    kernel, reason = await failure(server, kube_spec(kernelspec, queue="gpu-queue"))
    assert "LocalQueue 'gpu-queue' does not exist in namespace 'default'" in reason
    assert "LocalQueues there: user-queue" in reason
    await nothing_left(server, cluster, kernel)


async def test_a_missing_priority_class_is_refused_before_anything_is_created(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    kernel, reason = await failure(server, kube_spec(kernelspec, priority_class="urgent"))
    assert "WorkloadPriorityClass 'urgent' does not exist" in reason
    items, _ = cluster.store.list_objects("", "pods", "default")
    assert items == []
    await nothing_left(server, cluster, kernel)


async def test_rbac_forbidden_names_the_verb_and_the_resource(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    cluster.store.create("", "namespaces", None, {"metadata": {"name": "team-b"}})
    kernel, reason = await failure(server, kube_spec(kernelspec, namespace="team-b"))
    assert reason == (
        f"kernel {kernel[:8]}: the server's service account 'default/kernel-queue' may not get "
        "localqueues.kueue.x-k8s.io in namespace 'team-b'; grant it a Role in 'team-b' with verb "
        "'get' on 'localqueues.kueue.x-k8s.io' bound to it (see etc/kubernetes/rbac.yaml), or "
        "use a namespace where it may; nothing was created"
    )
    await nothing_left(server, cluster, kernel)  # `ours` looks in every namespace


async def test_a_namespace_kueue_does_not_manage_is_refused_and_cleaned_up(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    assert cluster.kueue is not None
    cluster.kueue.webhook.managed_namespaces = {"matchLabels": {"kueue": "on"}}
    kernel, reason = await failure(server, kube_spec(kernelspec))
    assert "namespace 'default' is not managed by Kueue" in reason
    assert "nothing was left behind" in reason
    await nothing_left(server, cluster, kernel)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        pytest.param("image", "ImagePullBackOff", id="image-pull-back-off"),
        pytest.param("unschedulable", "Unschedulable: 0/1 nodes are available", id="unschedulable"),
    ],
)
async def test_a_pod_that_cannot_start_fails_within_startup_timeout_with_its_message(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster, fault: str, expected: str
) -> None:
    assert cluster.kubelet is not None
    if fault == "image":
        cluster.kubelet.fail_image(image="registry.example/missing:*")
        name = kube_spec(kernelspec, image="registry.example/missing:1.0", startup_timeout=3)
    else:
        cluster.kubelet.unschedulable(selector="app.kubernetes.io/managed-by=kernel-queue")
        name = kube_spec(kernelspec, startup_timeout=3)
    kernel, reason = await failure(server, name)
    assert "did not start within startup_timeout" in reason
    assert expected in reason
    await nothing_left(server, cluster, kernel)


def crashing_spec(kernelspec: KernelspecFactory, jp_kernel_dir: Path) -> str:
    """A kube kernelspec whose kernel prints a line and exits 3 before it is ready."""
    name = kube_spec(kernelspec, "crashing")
    spec_path = jp_kernel_dir / name / "kernel.json"
    spec = json.loads(spec_path.read_text())
    spec["argv"] = CRASHING_KERNEL
    spec_path.write_text(json.dumps(spec))
    return name


async def test_a_pod_that_fails_before_it_is_ready_shows_its_last_log_lines(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster, jp_kernel_dir: Path
) -> None:
    _, reason = await failure(server, crashing_spec(kernelspec, jp_kernel_dir))
    assert "ended with exit code 3 before it was ready" in reason
    assert "boom: the kernel cannot start" in reason


async def test_a_pod_that_fails_before_it_is_ready_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster, jp_kernel_dir: Path
) -> None:
    kernel, reason = await failure(server, crashing_spec(kernelspec, jp_kernel_dir))
    assert "ended with exit code 3 before it was ready" in reason
    await nothing_left(server, cluster, kernel, within=20)  # the others are clean in 1-2 s


async def test_admission_timeout_ends_the_wait_and_deletes_the_group(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    holder = await server.start(kube_spec(kernelspec))
    assert (await server.execute(holder, "1"))["data"] == "1"
    impatient, reason = await failure(
        server, kube_spec(kernelspec, "impatient", admission_timeout=1)
    )
    assert impatient != holder
    assert "without being admitted (admission_timeout)" in reason
    await wait_clean(server, cluster, impatient)
    assert labelled(cluster, holder)["pods"]  # only the group that waited was deleted
    await server.shutdown(holder)
    await nothing_left(server, cluster, holder, impatient)
    assert launcher_pids() == set()
