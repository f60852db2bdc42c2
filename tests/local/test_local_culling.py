"""The idle culler never reaps a kernel that waits in the queue."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server

pytestmark = pytest.mark.local_gpus("0")


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    jp_server_config["MappingKernelManager"].update(cull_idle_timeout=1, cull_interval=1)
    return jp_server_config


async def test_the_culler_leaves_a_queued_kernel_alone(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    keep = kernelspec("keep", gpus=1, metadata={"cull_idle_timeout": 3600})
    holder = await server.start_running(keep)
    queued = await server.start(kernelspec("gpu", gpus=1))
    await server.wait_reason(queued, "position 1 of 1")
    # No cell on it: with a 1 s idle timeout the culler may take it before a cell's answer
    # comes back on a loaded machine.
    idle = await server.start(kernelspec("cpu", gpus=0, queue="cpu"))

    async def idle_culled() -> bool:
        return idle not in await server.kernel_ids()

    await server.wait_for(idle_culled, within=30)  # the culler ran, and culls idle kernels
    assert queued in await server.kernel_ids()
    assert (await server.model(queued))["reason"] == "queued in 'gpu', position 1 of 1, needs 1 GPU"
    await server.shutdown_and_wait(queued, holder)
