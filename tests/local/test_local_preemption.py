"""Priority preemption, in-place restart, cancel and culling on a one-GPU local backend."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import EventLog, KernelspecFactory, Server, launcher_pids

pytestmark = pytest.mark.local_gpus("0")


def _connection(server: Server, kernel_id: str) -> dict[str, Any]:
    info = server.app.kernel_manager.get_kernel(kernel_id).get_connection_info()
    return {k: v for k, v in info.items() if k.endswith("_port") or k in ("ip", "key")}


async def test_higher_priority_kernel_preempts_and_the_victim_comes_back_at_the_same_address(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog
) -> None:
    low = await server.start(kernelspec("low", gpus=1, priority_class="low"))
    assert (await server.execute(low, "x = 41; x + 1"))["data"] == "42"
    address = _connection(server, low)

    high = await server.start(kernelspec("high", gpus=1, priority_class="high"))
    assert (await server.execute(high, "1+1"))["data"] == "2"
    model = await server.wait_reason(low, "requeued")
    assert model["reason"] == "preempted; requeued in 'gpu', position 1 of 1, needs 1 GPU"

    await server.shutdown_and_wait(high)
    back = await server.execute(low, "x")
    assert back["error"] == "NameError"  # resumed fresh: no checkpoint yet, and it says so
    assert _connection(server, low) == address
    assert event_log.states(low) == [
        "admitted",
        "running",
        "preempted",
        "requeued",
        "admitted",
        "resumed",
    ]
    resumed = [e for e in event_log.events if e["kernel_id"] == low and e["state"] == "resumed"]
    assert "variables were not restored" in resumed[-1]["message"]
    preempted = [e for e in event_log.events if e["state"] == "preempted"]
    assert "preempted by higher-priority kernel" in preempted[0]["message"]
    assert "(priority 'high'), which needs 1 GPU" in preempted[0]["message"]
    await server.shutdown_and_wait(low)


async def test_restart_happens_in_place_and_keeps_the_admission(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog
) -> None:
    name = kernelspec(gpus=1)
    running = await server.start(name)
    before = await server.execute(running, "import os; x = 1; (os.getpid(), os.getppid())")
    waiting = await server.start(name)
    await server.wait_reason(waiting, "position 1 of 1")

    await server.fetch("api", "kernels", running, "restart", method="POST", body="{}")
    after = await server.execute(running, "import os; (os.getpid(), os.getppid())")
    pid_before, launcher_before = json.loads(before["data"].replace("(", "[").replace(")", "]"))
    pid_after, launcher_after = json.loads(after["data"].replace("(", "[").replace(")", "]"))
    assert launcher_after == launcher_before  # same launcher process
    assert pid_after != pid_before  # a new kernel process
    assert (await server.execute(running, "x"))["error"] == "NameError"
    assert (await server.model(waiting))["reason"] == (
        "queued in 'gpu', position 1 of 1, needs 1 GPU"
    )
    assert event_log.states(running) == ["admitted", "running"]
    assert event_log.states(waiting) == ["queued"]
    await server.shutdown_and_wait(waiting, running)


async def test_delete_of_a_queued_kernel_does_not_wait_for_admission(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    running = await server.start_running(name)
    launchers = launcher_pids()
    queued = await server.start(name)
    await server.wait_reason(queued, "position 1 of 1")

    # The GPU never frees: if DELETE waited for admission this would hang until the timeout.
    await server.shutdown(queued)

    async def gone() -> bool:
        return queued not in await server.kernel_ids()

    await server.wait_for(gone, within=30)
    assert launcher_pids() == launchers
    assert [g.ref.kernel_id for g in server.backend()._groups.values()] == [running]
    await server.shutdown_and_wait(running)
