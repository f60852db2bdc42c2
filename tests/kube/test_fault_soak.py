"""A fault soak in CI: 50 kernels through a real jupyter_server while the fake cluster injects
40 API faults; 0 stuck, 0 leaked, every failure a sentence (benchmarks/fault_soak.py runs 100)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kernel_queue_fake_cluster import soak
from kernel_queue_fake_cluster.cluster import FakeCluster
from tornado.httpclient import HTTPClientError

from tests.conftest import KernelspecFactory, Server
from tests.kube.support import GPU_QUOTA, kube_spec, queue_entry

pytestmark = pytest.mark.timeout(600)


class Rest:
    """`soak.Jupyter` over the test server's REST API."""

    def __init__(self, server: Server) -> None:
        self.server = server

    async def start(self, kernelspec: str) -> str:
        return await self.server.start(kernelspec)

    async def entry(self, kernel_id: str) -> dict[str, Any]:
        return await queue_entry(self.server, kernel_id)

    async def delete(self, kernel_id: str) -> None:
        try:
            await self.server.shutdown(kernel_id)
        except HTTPClientError as exc:
            if exc.code != 404:  # gone already (its start failed): as asked
                raise

    async def listed(self) -> set[str]:
        response = await self.server.fetch("api", "kernels", method="GET")
        return {k["id"] for k in json.loads(response.body)}


@pytest.mark.parametrize("backend_config", [{"reap_interval": 2.0}])
async def test_fifty_kernels_under_forty_faults_leave_nothing_and_none_is_stuck(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster, backend_config: Any
) -> None:
    assert cluster.kueue is not None
    cluster.kueue.set_quota("cluster-queue", "default-flavor", {**GPU_QUOTA, "nvidia.com/gpu": 3})
    report = await soak.soak(
        cluster, Rest(server), kube_spec(kernelspec), kernels=50, parallel=6, faults=40
    )
    print(report.summary(), *report.failed.values(), sep="\n")
    assert report.faults == 40 and report.faults_met == 40
    assert report.stuck == {}
    assert report.leaked == {}
    assert report.unclear == {}
    assert report.errors == []
    assert report.ran > 0 and report.cancelled > 0
