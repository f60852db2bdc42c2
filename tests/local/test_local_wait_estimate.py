"""The local backend estimates a wait as the kubernetes backend does: from the admissions it
made in the queue, once there were enough of them."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import KernelspecFactory, Server

pytestmark = pytest.mark.local_gpus("0")


async def test_after_three_admissions_a_waiting_kernel_gets_an_estimate(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    running = await server.start_running(name)
    for _ in range(2):  # two more admissions, each once the kernel before was shut down
        waiting = await server.start(name)
        model = await server.wait_reason(waiting, "position 1 of 1")
        assert model["reason"] == "queued in 'gpu', position 1 of 1, needs 1 GPU"
        await server.shutdown_and_wait(running)
        assert (await server.execute(waiting, "1"))["data"] == "1"
        running = waiting
    last = await server.start(name)
    model = await server.wait_reason(last, "at the recent rate")
    assert re.fullmatch(
        r"queued in 'gpu', position 1 of 1, needs 1 GPU; about \d+ s at the recent rate",
        model["reason"],
    ), model["reason"]
    response = await server.fetch("api", "kernel-queue", "kernels", method="GET")
    (entry,) = [k for k in json.loads(response.body) if k["id"] == last]
    assert 0 < entry["queue"]["estimated_wait_seconds"] <= 60
    await server.shutdown_and_wait(running, last)
