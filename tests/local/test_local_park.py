"""Parking on the local backend, through a real jupyter_server and real kernels: a parked
kernel's GPU goes to the next in line, the parked kernel stays listed with what it saved, and
when woken it waits in the queue with its position, comes back and has its variables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernel_queue import errors
from kernel_queue.server import kernels
from kernel_queue.session import KernelSession
from tests.conftest import EventLog, KernelspecFactory, Server, launcher_pids


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": ["0"]}


def _session(server: Server, kernel_id: str) -> KernelSession:
    session = kernels.session_of(server.app.kernel_manager.get_kernel(kernel_id))
    assert session is not None, f"kernel {kernel_id} has no session"
    return session


def _saved(kernelspec: KernelspecFactory, store: Path, name: str = "saved") -> str:
    checkpoint = {"enabled": True, "path": str(store), "grace_seconds": 60}
    return kernelspec(name, gpus=1, checkpoint=checkpoint)


async def test_a_parked_kernel_gives_its_gpu_to_the_next_and_comes_back_with_its_variables(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog, tmp_path: Path
) -> None:
    name = _saved(kernelspec, tmp_path / "checkpoints")
    parked = await server.start(name)
    assert (await server.execute(parked, "x = 41; words = ['a', 'b']"))["status"] == "ok"
    waiting = await server.start(name)
    await server.wait_reason(waiting, "position 1 of 1")

    await _session(server, parked).park()
    model = await server.wait_reason(parked, "GPU released")
    assert model["reason"].startswith("parked on request; GPU released; your next cell brings")
    assert "saved 2 variables" in model["reason"], model["reason"]
    assert _session(server, parked).parked
    assert not launcher_pids((parked,))  # no process holds the GPU
    assert (await server.execute(waiting, "import os; os.environ['CUDA_VISIBLE_DEVICES']"))[
        "data"
    ] == "'0'"
    listed = (await server.fetch("api", "kernel-queue", "kernels")).body
    assert b'"state": "parked"' in listed

    await _session(server, parked).resume()
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
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    store = tmp_path / "checkpoints"
    kernel = await server.start(_saved(kernelspec, store))
    assert (await server.execute(kernel, "y = 1"))["status"] == "ok"
    await _session(server, kernel).park(idle_seconds=1800)
    model = await server.wait_reason(kernel, "GPU released")
    assert model["reason"].startswith("parked after 30 min idle; GPU released;")

    await server.shutdown_and_wait(kernel)
    assert not server.backend()._groups
    assert not (store / kernel).exists()


async def test_a_kernel_without_checkpoints_or_not_running_is_not_parked(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    fresh = await server.start(kernelspec("fresh", gpus=1))
    assert (await server.execute(fresh, "z = 1"))["status"] == "ok"
    with pytest.raises(errors.ParkRefused, match="saves no checkpoints, so parking would lose"):
        await _session(server, fresh).park()
    waiting = await server.start(_saved(kernelspec, tmp_path / "checkpoints"))
    await server.wait_reason(waiting, "position 1 of 1")
    with pytest.raises(errors.ParkRefused, match=r"is queued, not running: only a running"):
        await _session(server, waiting).park()
    assert (await server.execute(fresh, "z"))["data"] == "1"  # nothing changed
    await server.shutdown_and_wait(waiting, fresh)


async def test_a_restart_of_a_parked_kernel_wakes_it(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    kernel = await server.start(_saved(kernelspec, tmp_path / "checkpoints"))
    assert (await server.execute(kernel, "v = 7"))["status"] == "ok"
    await _session(server, kernel).park()
    await server.wait_reason(kernel, "GPU released")
    await server.fetch("api", "kernels", kernel, "restart", method="POST", body="{}")
    assert (await server.execute(kernel, "1 + 1"))["data"] == "2"
    await server.shutdown_and_wait(kernel)


async def test_five_park_and_wake_cycles_lose_nothing(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    kernel = await server.start(_saved(kernelspec, tmp_path / "checkpoints"))
    assert (await server.execute(kernel, "n = 0; seen = []"))["status"] == "ok"
    session = _session(server, kernel)
    for cycle in range(1, 6):
        await session.park()
        await server.wait_reason(kernel, "GPU released")
        await session.resume()  # as the next cell does through the server
        back = await server.execute(kernel, f"n += 1; seen.append({cycle}); n, seen")
        assert back["data"] == f"({cycle}, {list(range(1, cycle + 1))})", (cycle, back)
    assert (await server.model(kernel))["execution_state"] != "dead"
    await server.shutdown_and_wait(kernel)


async def test_a_shutdown_while_it_parks_ends_it_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    store = tmp_path / "checkpoints"
    kernel = await server.start(_saved(kernelspec, store))
    assert (await server.execute(kernel, "big = bytes(50_000_000)"))["status"] == "ok"
    await _session(server, kernel).park()
    await server.shutdown_and_wait(kernel)  # while it saves
    assert not server.backend()._groups
    assert not (store / kernel).exists()
    follower = await server.start(_saved(kernelspec, store, "follower"))
    assert (await server.execute(follower, "1"))["data"] == "1"  # the GPU is free
    await server.shutdown_and_wait(follower)


async def test_a_resume_while_it_parks_brings_it_back_once_parked(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog, tmp_path: Path
) -> None:
    kernel = await server.start(_saved(kernelspec, tmp_path / "checkpoints"))
    assert (await server.execute(kernel, "w = 'kept'; big = bytes(50_000_000)"))["status"] == "ok"
    session = _session(server, kernel)
    await session.park()
    await session.park()  # a second park changes nothing
    await session.resume()  # while it still saves
    assert (await server.execute(kernel, "w"))["data"] == "'kept'"
    states = event_log.states(kernel)  # the GPU is free: admitted at once, never requeued
    assert states[-3:] == ["parked", "admitted", "resumed"], states
    await server.shutdown_and_wait(kernel)


async def test_a_provisioner_reattached_to_a_parked_kernel_says_what_the_first_said(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    """A front end that persists its kernels (a gateway, a restarted server) reattaches with
    the parked kernel's reason intact: why and since when it was parked, and that its
    variables come back (it said "parked on request … (checkpoints are off)")."""
    from kernel_queue.provisioner import QueuedKernelProvisioner

    kernel = await server.start(_saved(kernelspec, tmp_path / "checkpoints"))
    assert (await server.execute(kernel, "y = 1"))["status"] == "ok"
    first = server.app.kernel_manager.get_kernel(kernel).provisioner
    await _session(server, kernel).park(idle_seconds=1800)
    await server.wait_reason(kernel, "GPU released")
    said = _session(server, kernel).queue_status()
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
