"""Parking on the local backend, through a real jupyter_server and real kernels: a parked
kernel's GPU goes to the next in line, the parked kernel stays listed with what it saved, and
when woken it waits in the queue with its position, comes back and has its variables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernel_queue import errors
from tests.conftest import EventLog, KernelspecFactory, Server, launcher_pids
from tests.local_parking import park, running, saving, session_of


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": ["0"]}


async def test_a_parked_kernel_gives_its_gpu_to_the_next_and_comes_back_with_its_variables(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog, store: Path
) -> None:
    name = saving(kernelspec, store)
    parked = await running(server, name, "x = 41; words = ['a', 'b']")
    waiting = await server.start(name)
    await server.wait_reason(waiting, "position 1 of 1")

    model = await park(server, parked)
    assert model["reason"].startswith("parked on request; GPU released; your next cell brings")
    assert "saved 2 variables" in model["reason"], model["reason"]
    assert session_of(server, parked).parked
    assert not launcher_pids((parked,))  # no process holds the GPU
    assert (await server.execute(waiting, "import os; os.environ['CUDA_VISIBLE_DEVICES']"))[
        "data"
    ] == "'0'"
    listed = (await server.fetch("api", "kernel-queue", "kernels")).body
    assert b'"state": "parked"' in listed

    await session_of(server, parked).resume()
    model = await server.wait_reason(parked, "waking from parked")
    assert model["reason"] == "waking from parked: queued in 'gpu', position 1 of 1, needs 1 GPU"

    await server.shutdown_and_wait(waiting)
    back = await server.execute(parked, "x + 1, words")
    assert back["data"] == "(42, ['a', 'b'])", back
    states = event_log.states(parked)
    assert states[-4:] == ["parked", "requeued", "admitted", "resumed"], states
    parked_events = [e for e in event_log.events if e["kernel_id"] == parked]
    assert [e["parks"] for e in parked_events][-1] == 1
    assert any(e["parked_since"] for e in parked_events if e["state"] == "parked")
    await server.shutdown_and_wait(parked)


async def test_a_parked_kernel_shut_down_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel = await running(server, saving(kernelspec, store), "y = 1")
    model = await park(server, kernel, idle_seconds=1800)
    assert model["reason"].startswith("parked after 30 min idle; GPU released;")

    await server.shutdown_and_wait(kernel)
    assert not server.backend()._groups
    assert not (store / kernel).exists()


async def test_a_kernel_without_checkpoints_or_not_running_is_not_parked(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    fresh = await running(server, kernelspec("fresh", gpus=1), "z = 1")
    with pytest.raises(errors.ParkRefused, match="saves no checkpoints, so parking would lose"):
        await session_of(server, fresh).park()
    waiting = await server.start(saving(kernelspec, store))
    await server.wait_reason(waiting, "position 1 of 1")
    with pytest.raises(errors.ParkRefused, match=r"is queued, not running: only a running"):
        await session_of(server, waiting).park()
    assert (await server.execute(fresh, "z"))["data"] == "1"  # nothing changed
    await server.shutdown_and_wait(waiting, fresh)


async def test_a_restart_of_a_parked_kernel_wakes_it(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel = await running(server, saving(kernelspec, store), "v = 7")
    await park(server, kernel)
    await server.fetch("api", "kernels", kernel, "restart", method="POST", body="{}")
    assert (await server.execute(kernel, "1 + 1"))["data"] == "2"
    await server.shutdown_and_wait(kernel)


async def test_five_park_and_wake_cycles_lose_nothing(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel = await running(server, saving(kernelspec, store), "n = 0; seen = []")
    session = session_of(server, kernel)
    for cycle in range(1, 6):
        await session.park()
        await server.wait_reason(kernel, "GPU released")
        await session.resume()  # as the next cell does through the server
        back = await server.execute(kernel, f"n += 1; seen.append({cycle}); n, seen")
        assert back["data"] == f"({cycle}, {list(range(1, cycle + 1))})", (cycle, back)
    assert (await server.model(kernel))["execution_state"] != "dead"
    await server.shutdown_and_wait(kernel)


async def test_a_shutdown_while_it_parks_ends_it_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel = await running(server, saving(kernelspec, store), "big = bytes(50_000_000)")
    await session_of(server, kernel).park()
    await server.shutdown_and_wait(kernel)  # while it saves
    assert not server.backend()._groups
    assert not (store / kernel).exists()
    follower = await server.start(saving(kernelspec, store, "follower"))
    assert (await server.execute(follower, "1"))["data"] == "1"  # the GPU is free
    await server.shutdown_and_wait(follower)


async def test_a_resume_while_it_parks_brings_it_back_once_parked(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog, store: Path
) -> None:
    kernel = await running(server, saving(kernelspec, store), "w = 'kept'; big = bytes(50_000_000)")
    session = session_of(server, kernel)
    await session.park()
    await session.park()  # a second park changes nothing
    await session.resume()  # while it still saves
    assert (await server.execute(kernel, "w"))["data"] == "'kept'"
    states = event_log.states(kernel)  # the GPU is free: admitted at once, never requeued
    assert states[-3:] == ["parked", "admitted", "resumed"], states
    await server.shutdown_and_wait(kernel)


async def test_a_provisioner_reattached_to_a_parked_kernel_says_what_the_first_said(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    """A front end that persists its kernels (a gateway, a restarted server) reattaches with
    the parked kernel's reason intact: why and since when it was parked, and that its
    variables come back (it said "parked on request … (checkpoints are off)")."""
    from kernel_queue.provisioner import QueuedKernelProvisioner

    kernel = await running(server, saving(kernelspec, store), "y = 1")
    first = server.app.kernel_manager.get_kernel(kernel).provisioner
    await park(server, kernel, idle_seconds=1800)
    said = session_of(server, kernel).queue_status()
    info = await first.get_provisioner_info()

    km = server.app.kernel_manager.get_kernel(kernel)
    again = QueuedKernelProvisioner(kernel_id=kernel, kernel_spec=km.kernel_spec, parent=km)
    await again.load_provisioner_info(info)
    told = again.kernel_session.queue_status() if again.kernel_session else None
    assert told is not None
    assert told["message"] == said["message"]
    assert told["message"].startswith("parked after 30 min idle; GPU released; your next cell")
    assert told["parked_since"] == said["parked_since"]
    await server.shutdown_and_wait(kernel)
    await again.cleanup()  # stops following the ended group
