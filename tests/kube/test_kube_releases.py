"""End to end on the API versions of each Kueue release: the backend reads discovery and speaks
v1beta1 where a cluster serves no v1beta2 (Kueue 0.13 and 0.14), for its objects and for the
visibility API each, through a real jupyter_server against the fake cluster loaded with that
release's CRDs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster
from kernel_queue_fake_cluster.kueue import visibility

from tests.conftest import KUEUE_DATA, KernelspecFactory, Server, skip_unless_ci
from tests.kube.support import kube_spec, wait_clean, waits_then_runs

V014, V019 = KUEUE_DATA / "v0.14" / "crds", KUEUE_DATA / "crds"


@pytest.fixture
def cluster_options(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`(crds, visibility versions)` as the test's parameter (0.19's by default): the fake
    cluster of those CRDs serving its visibility API at those versions only."""
    crds, served = getattr(request, "param", (V019, ("v1beta2", "v1beta1")))
    if not Path(crds).is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {crds} (../shared is absent)")
    monkeypatch.setattr(visibility, "VERSIONS", served)
    return {"crds": crds}


RELEASES = [
    pytest.param((V014, ("v1beta1",)), id="0.14"),
    pytest.param((V019, ("v1beta2", "v1beta1")), id="0.19"),
    pytest.param((V019, ("v1beta1",)), id="objects-v1beta2-visibility-v1beta1"),
]


@pytest.mark.parametrize("cluster_options", RELEASES, indirect=True)
async def test_a_kernel_waits_with_its_position_then_runs_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    _, _, waited = await waits_then_runs(server, cluster, kube_spec(kernelspec), "position 1 of 1")
    assert waited.startswith("queued in 'user-queue', position 1 of 1, needs 1 GPU")


@pytest.mark.parametrize("cluster_options", RELEASES[:1], indirect=True)
async def test_on_kueue_0_14_a_preempted_kernel_is_requeued_and_comes_back(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    low = await server.start(kube_spec(kernelspec, "low", priority_class="low"))
    assert (await server.execute(low, "x = 41; x + 1"))["data"] == "42"
    high = await server.start(kube_spec(kernelspec, "high", priority_class="high"))
    assert (await server.execute(high, "1+1"))["data"] == "2"
    await server.wait_reason(low, "requeued in 'user-queue', position 1 of 1")
    await server.shutdown(high)
    assert (await server.execute(low, "2+3"))["data"] == "5"
    await server.shutdown(low)
    await wait_clean(server, cluster, low, high)


async def test_a_kernelspec_may_name_the_default_class_and_its_pods_carry_it(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    default = {"kind": "WorkloadPriorityClass", "metadata": {"name": "default"}, "value": 10}
    cluster.apply([{"apiVersion": "kueue.x-k8s.io/v1beta2", **default}])
    kernel = await server.start(kube_spec(kernelspec, priority_class="default"))
    assert (await server.execute(kernel, "1+1"))["data"] == "2"
    pods, _ = cluster.store.list_objects(
        "", "pods", "default", labels=f"kernel-queue.dev/kernel-id={kernel}"
    )
    assert [p["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] for p in pods] == ["default"]
    await server.shutdown(kernel)
    await wait_clean(server, cluster, kernel)
