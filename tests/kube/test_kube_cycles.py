"""Ten preemptions of one kernel's pod group lose nothing, on both planes: each replacement
pod restores from the claim what the previous one saved (tests/cycle_torture.py)."""

from __future__ import annotations

import pytest

from tests.conftest import KernelspecFactory, Server
from tests.cycle_torture import torture
from tests.kube.planes import Plane
from tests.kube.support import checkpointed, kube_spec, wait_clean

pytestmark = pytest.mark.timeout(900)


async def test_ten_preemptions_of_a_pod_group_lose_no_value_and_report_every_name(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    low = await server.start(checkpointed(plane, kernelspec, "low", priority_class="low"))
    high_name = kube_spec(kernelspec, "high", priority_class="high")

    async def preempt(kernel_id: str) -> str:
        high = await server.start(high_name)
        assert (await server.execute(high, "1", within=120))["data"] == "1"
        model = await server.wait_reason(kernel_id, "saved ", within=120)
        await server.shutdown(high)
        await wait_clean(server, plane, high, within=120)
        return str(model["reason"])

    await torture(server, low, preempt, cycles=10)
    await server.shutdown(low)
    await wait_clean(server, plane, low, within=120)
