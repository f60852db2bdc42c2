"""What a waiting kernel's reason says, on both planes (the real plane's reasons are the ones the
real Kueue writes): Kueue's own reason in the user's words, a request the queue can never admit
failing at once, a Kueue that does not answer, an inactive queue named, and the estimate of the
wait once admissions were seen."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import kube_spec, labelled, queue_entry, wait_clean

G = "kueue.x-k8s.io"


async def test_a_kernel_asking_for_more_than_the_cluster_queue_has_fails_at_once(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, event_log: Any
) -> None:
    kernel = await server.start(kube_spec(kernelspec, gpus=3))

    async def dead() -> bool:
        return (await server.model(kernel))["execution_state"] == "dead"

    await server.wait_for(dead, within=60, what="the kernel failed")
    assert (await server.model(kernel))["reason"] == (
        f"kernel {kernel[:8]} asks for 3 nvidia.com/gpu but ClusterQueue 'cluster-queue' can "
        "never give more than 1, so it could never start. Ask for fewer `gpus` in the "
        "kernelspec, or use a `queue` whose ClusterQueue has more."
    )
    # what JupyterLab's label reads ("needs 3 GPUs, 1 exists"), as the local backend says it
    said = [e for e in event_log.events if e["kernel_id"] == kernel and e["state"] == "failed"]
    assert (said[-1]["needs"], said[-1]["has"]) == ("3 GPUs", {"gpus": 1})
    await wait_clean(server, plane, kernel)
    assert labelled(plane, kernel) == {}


def orphan_queue(plane: Plane) -> None:
    """A LocalQueue `orphan-queue` whose ClusterQueue `missing-cq` does not exist."""
    plane.apply(
        [
            {
                "apiVersion": f"{G}/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "orphan-queue", "namespace": "default"},
                "spec": {"clusterQueue": "missing-cq"},
            }
        ]
    )


def stop_cluster_queue(plane: Plane) -> None:
    """`stopPolicy: Hold` on the ClusterQueue of `user-queue`."""
    plane.merge_patch(G, "clusterqueues", None, "cluster-queue", {"spec": {"stopPolicy": "Hold"}})


@pytest.mark.parametrize(
    ("setup", "queue", "expected"),
    [
        pytest.param(
            orphan_queue,
            "orphan-queue",
            "queued in 'orphan-queue', needs 1 GPU; LocalQueue 'orphan-queue' is inactive "
            "(ClusterQueueDoesNotExist): its ClusterQueue 'missing-cq' does not exist; ask the "
            "cluster's admin to create it, or use another `queue`",
            id="cluster-queue-missing",
        ),
        pytest.param(
            stop_cluster_queue,
            "user-queue",
            "LocalQueue 'user-queue' is inactive (ClusterQueueIsInactive): its ClusterQueue "
            "'cluster-queue' is stopped or inactive and admits nothing until the cluster's admin "
            "restarts it",
            id="cluster-queue-stopped",
        ),
    ],
)
async def test_an_inactive_local_queue_is_named_with_kueue_s_reason(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    setup: Any,
    queue: str,
    expected: str,
) -> None:
    setup(plane)
    kernel = await server.start(kube_spec(kernelspec, queue=queue))
    model = await server.wait_reason(kernel, expected)
    assert model["execution_state"] != "dead"  # it waits: the admin may fix the queue
    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)


@pytest.mark.parametrize("backend_config", [{"kueue_timeout": 1.0}])
async def test_a_kueue_whose_controller_does_not_run_is_named_not_queued(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    with plane.kueue_controller_paused():  # its webhook still gates the pods
        kernel = await server.start(kube_spec(kernelspec))
        silent = (
            "Kueue does not answer: no Workload for the kernel's pods after 1 s: is Kueue's "
            "controller running in the cluster? The kernel keeps waiting for 'user-queue' "
            "(needs 1 GPU)."
        )
        model = await server.wait_reason(kernel, silent)
        assert model["reason"] == silent
    # the controller runs again: the kernel is queued, admitted and runs
    assert (await server.execute(kernel, "6*7"))["data"] == "42"
    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)


async def test_after_enough_admissions_a_waiting_kernel_gets_an_estimate(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, event_log: Any
) -> None:
    name = kube_spec(kernelspec)
    first = await server.start_running(name)
    kernels = [first]
    for _ in range(2):  # two more admissions in the queue, each after the one before ended
        waiting = await server.start(name)
        await server.wait_reason(waiting, "position 1 of 1")
        assert "at the recent rate" not in (await server.model(waiting))["reason"]
        await server.shutdown(kernels[-1])
        assert (await server.execute(waiting, "1"))["data"] == "1"
        kernels.append(waiting)
    last = await server.start(name)
    # (the estimate may come before Kueue's pending message: the real Kueue writes it later)
    model = await server.wait_reason(last, "to free up in ClusterQueue 'cluster-queue'; about ")
    assert re.fullmatch(
        r"queued in 'user-queue', position 1 of 1, needs 1 GPU; waiting for 1 more "
        r"nvidia.com/gpu to free up in ClusterQueue 'cluster-queue'; about \d+ (s|min) at the "
        r"recent rate",
        model["reason"],
    ), model["reason"]
    entry = (await queue_entry(server, last))["queue"]
    assert isinstance(entry["estimated_wait_seconds"], int)
    assert entry["estimated_wait_seconds"] > 0
    said = [e for e in event_log.events if e["kernel_id"] == last and e["state"] == "queued"]
    assert said[-1]["estimated_wait_seconds"] == entry["estimated_wait_seconds"]
    for kernel in (last, kernels[-1]):
        await server.shutdown(kernel)
    await wait_clean(server, plane, *kernels, last)
