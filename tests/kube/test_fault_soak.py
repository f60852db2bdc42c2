"""A fault soak in CI, on both planes: kernels through a real jupyter_server while the plane
injects API faults (the real plane's from the FaultProxy in front of its API server); 0 stuck,
0 leaked, every failure a sentence. On the fake 50 kernels under 40 faults (benchmarks/
fault_soak.py runs 100); on the real control plane, where a kernel costs seconds of real pods,
scheduler and Kueue, fewer (`SOAK`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kernel_queue_fake_cluster import soak
from tornado.httpclient import HTTPClientError

from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import GPU_QUOTA, kube_spec, queue_entry

pytestmark = pytest.mark.timeout(600)

SOAK = {"fake": (50, 40, 3), "real": (24, 20, 2)}
"""Per plane: kernels, faults among them, and the GPUs of the queue's quota (as many as the real
plane's node has: a quota beyond it admits kernels whose pods then wait for the scheduler)."""


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
async def test_kernels_under_faults_leave_nothing_and_none_is_stuck(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, backend_config: Any
) -> None:
    kernels, faults, gpus = SOAK[plane.kind]
    plane.set_quota("cluster-queue", "default-flavor", {**GPU_QUOTA, "nvidia.com/gpu": gpus})
    report = await soak.soak(
        plane, Rest(server), kube_spec(kernelspec), kernels=kernels, parallel=6, faults=faults
    )
    print(report.summary(), *report.failed.values(), sep="\n")
    assert report.faults == faults and report.faults_met == faults
    assert report.stuck == {}
    assert report.leaked == {}
    assert report.unclear == {}
    assert report.errors == []
    assert report.ran > 0 and report.cancelled > 0
