"""Kubernetes backend errors that name the fix, each on both planes (one on the fake only), each
leaving nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from tests.conftest import KernelspecFactory, Server, launcher_pids
from tests.kube import images
from tests.kube.planes import Plane
from tests.kube.support import failure, kube_spec, labelled, ours, wait_clean

CRASHING_KERNEL = [
    "python",
    "-c",
    "import sys; print('boom: the kernel cannot start'); sys.exit(3)",
]


async def nothing_left(
    server: Server, where: Plane | FakeCluster, *kernel_ids: str, within: float = 60
) -> None:
    """Nothing of these kernels (at least one) is left, nor anything else kernel-queue made."""
    assert kernel_ids
    await wait_clean(server, where, *kernel_ids, within=within)
    assert ours(where) == {}


# Fake only: every real plane serves Kueue's API (a cluster without it is the fake's crds=False).
@pytest.mark.parametrize("cluster_options", [{"crds": False, "kueue": False}])
async def test_kueue_not_installed_says_so(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    kernel, reason = await failure(server, kube_spec(kernelspec))
    assert "the cluster serves no Kueue API" in reason
    assert "install Kueue" in reason
    await nothing_left(server, cluster, kernel)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            {"queue": "gpu-queue"},
            [
                "LocalQueue 'gpu-queue' does not exist in namespace 'default'",
                "LocalQueues there: user-queue",
            ],
            id="local-queue",
        ),
        pytest.param(
            {"priority_class": "urgent"},
            ["WorkloadPriorityClass 'urgent' does not exist"],
            id="priority-class",
        ),
    ],
)
async def test_a_missing_queue_or_priority_class_is_refused_before_anything_is_created(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    config: dict[str, str],
    expected: list[str],
) -> None:
    kernel, reason = await failure(server, kube_spec(kernelspec, **config))
    for sentence in expected:
        assert sentence in reason
    assert plane.objects("", "pods", "default") == []
    await nothing_left(server, plane, kernel)


async def test_rbac_forbidden_names_the_verb_and_the_resource(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}}])
    kernel, reason = await failure(server, kube_spec(kernelspec, namespace="team-b"))
    assert reason == (
        f"kernel {kernel[:8]}: the server's service account 'default/kernel-queue' may not get "
        "localqueues.kueue.x-k8s.io in namespace 'team-b'; grant it a Role in 'team-b' with verb "
        "'get' on 'localqueues.kueue.x-k8s.io' bound to it (see etc/kubernetes/rbac.yaml), or "
        "use a namespace where it may; nothing was created"
    )
    await nothing_left(server, plane, kernel)  # `ours` looks in every namespace


async def test_a_namespace_kueue_does_not_manage_is_refused_and_cleaned_up(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    with plane.kueue_manages_only({"matchLabels": {"kueue": "on"}}):
        kernel, reason = await failure(server, kube_spec(kernelspec))
    assert "namespace 'default' is not managed by Kueue" in reason
    assert "nothing was left behind" in reason
    await nothing_left(server, plane, kernel)


NOWHERE = {"spec": {"nodeSelector": {"kernel-queue.test/pool": "none"}}}
"""A pod template no node matches: the scheduler never binds its pods."""


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            {"image": images.MISSING_IMAGE.replace("*", "1.0")},
            "ImagePullBackOff",
            id="image-pull-back-off",
        ),
        pytest.param(
            {"pod_template": NOWHERE},
            "Unschedulable: 0/1 nodes are available: 1 node(s) didn't match Pod's node "
            "affinity/selector",
            id="unschedulable",
        ),
    ],
)
async def test_a_pod_that_cannot_start_fails_within_startup_timeout_with_its_message(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    config: dict[str, object],
    expected: str,
) -> None:
    kernel, reason = await failure(server, kube_spec(kernelspec, startup_timeout=3, **config))
    assert "did not start within startup_timeout" in reason
    assert expected in reason
    await nothing_left(server, plane, kernel)


def crashing_spec(kernelspec: KernelspecFactory, jp_kernel_dir: Path) -> str:
    """A kube kernelspec whose kernel prints a line and exits 3 before it is ready."""
    name = kube_spec(kernelspec, "crashing")
    spec_path = jp_kernel_dir / name / "kernel.json"
    spec = json.loads(spec_path.read_text())
    spec["argv"] = CRASHING_KERNEL
    spec_path.write_text(json.dumps(spec))
    return name


async def test_a_pod_that_fails_before_it_is_ready_shows_its_last_log_lines(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, jp_kernel_dir: Path
) -> None:
    _, reason = await failure(server, crashing_spec(kernelspec, jp_kernel_dir))
    assert "ended with exit code 3 before it was ready" in reason
    assert "boom: the kernel cannot start" in reason


async def test_a_pod_that_fails_before_it_is_ready_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, jp_kernel_dir: Path
) -> None:
    kernel, reason = await failure(server, crashing_spec(kernelspec, jp_kernel_dir))
    assert "ended with exit code 3 before it was ready" in reason
    await nothing_left(server, plane, kernel, within=20)  # the others are clean in 1-2 s
    # Kueue waits for a replacement of the failed pod (WaitingForReplacementPods, PodsFailed),
    # but a crash is no eviction: the kernel failed, and no pod was made again.
    assert plane.requests[("create", "pods")] == 1


async def test_admission_timeout_ends_the_wait_and_deletes_the_group(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    holder = await server.start_running(kube_spec(kernelspec))
    impatient, reason = await failure(
        server, kube_spec(kernelspec, "impatient", admission_timeout=1)
    )
    assert impatient != holder
    assert "without being admitted (admission_timeout)" in reason
    await wait_clean(server, plane, impatient)
    assert labelled(plane, holder)["pods"]  # only the group that waited was deleted
    await server.shutdown(holder)
    await nothing_left(server, plane, holder, impatient)
    assert launcher_pids() == set()
