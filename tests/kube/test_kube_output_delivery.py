"""Output is never lost on the kubernetes backend either: a cell sent while the preempted pod
group waits for re-admission runs on the replacement pod, and both held clients (the server's
websocket and a direct client on the Service's address) see its output (tests/server/
test_output_delivery.py holds the local backend's checks and the LocalProvisioner control; both
run `lost_across_resumes`)."""

from __future__ import annotations

import pytest

from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import kube_spec, wait_clean
from tests.server.clients import lost_across_resumes

pytestmark = pytest.mark.timeout(600)

RESUMES = 5


async def test_the_first_cell_after_a_resume_of_a_pod_group_loses_no_output(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    low = await server.start(kube_spec(kernelspec, "low", priority_class="low"))
    assert (await server.execute(low, "1", within=120))["data"] == "1"
    high_name = kube_spec(kernelspec, "high", priority_class="high")

    async def end(high: str) -> None:
        await server.shutdown(high)
        await wait_clean(server, plane, high, within=120)

    lost = await lost_across_resumes(server, low, high_name, RESUMES, end, within=120)
    assert lost == [], f"{len(lost)} of {2 * RESUMES} cells lost output: {lost}"
    await server.shutdown(low)
    await wait_clean(server, plane, low, within=120)
