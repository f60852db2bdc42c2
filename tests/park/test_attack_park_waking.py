"""A kernel shut down, restarted or interrupted while it wakes from parked, on the local
backend with real kernels: waiting in its queue behind another kernel, or restoring once
admitted. Each ends as asked and leaves nothing (no launcher, no group, no checkpoints), and the
GPU goes to the next kernel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server, launcher_pids
from tests.local_parking import in_store, park, running, saving, session_of


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": ["0"]}


async def _parked_behind_another(server: Server, name: str) -> tuple[str, str]:
    """A parked kernel woken while another holds the only GPU: it waits in its queue."""
    kernel = await running(server, name, "x = 41; big = bytes(20_000_000)")
    await park(server, kernel)
    other = await server.start(name)
    assert (await server.execute(other, "1"))["data"] == "1"
    await session_of(server, kernel).resume()
    await server.wait_reason(kernel, "waking from parked: queued in 'gpu', position 1 of 1")
    return kernel, other


async def test_a_kernel_shut_down_while_it_waits_to_wake_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel, other = await _parked_behind_another(server, saving(kernelspec, store))
    await server.shutdown_and_wait(kernel)
    assert not (store / kernel).exists()
    assert (await server.execute(other, "2"))["data"] == "2"
    await server.shutdown_and_wait(other)
    assert not server.backend()._groups and launcher_pids() == set()


async def test_a_kernel_shut_down_while_it_restores_leaves_nothing_and_frees_the_gpu(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    name = saving(kernelspec, store)
    kernel, other = await _parked_behind_another(server, name)
    await server.shutdown_and_wait(other)  # it is admitted and starts restoring
    await server.wait_reason(kernel, "admitted", within=30)
    await server.shutdown_and_wait(kernel)
    assert not (store / kernel).exists()
    assert not server.backend()._groups and launcher_pids() == set()
    follower = await server.start(name)
    assert (await server.execute(follower, "3"))["data"] == "3"  # the GPU is free
    await server.shutdown_and_wait(follower)


async def test_a_kernel_interrupted_or_restarted_while_it_waits_to_wake_comes_back(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel, other = await _parked_behind_another(server, saving(kernelspec, store))
    interrupted = await server.fetch("api", "kernels", kernel, "interrupt", method="POST", body="")
    assert interrupted.code == 204
    await server.shutdown_and_wait(other)
    back = await server.execute(kernel, "import time; time.sleep(0.5); x + 1")
    assert (back["status"], back["data"]) == ("ok", "42"), back
    await server.shutdown_and_wait(kernel)
    assert not (store / kernel).exists()


async def test_the_servers_shutdown_with_kernels_parked_and_waking_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    name = saving(kernelspec, store)
    waking, other = await _parked_behind_another(server, name)
    parked = await server.start(name)
    await server.wait_reason(parked, "position 2 of 2")
    await server.shutdown_and_wait(other)
    assert (await server.execute(waking, "x"))["data"] == "41"
    await session_of(server, waking).park()  # the third runs, then is parked too
    assert (await server.execute(parked, "y = 1"))["status"] == "ok"
    await park(server, parked)
    await session_of(server, waking).resume()

    backend = server.backend()
    await server.app.kernel_manager.shutdown_all()  # as the server's own shutdown does
    assert await server.kernel_ids() == set()
    assert not backend._groups and launcher_pids() == set()
    assert in_store(store) == []
