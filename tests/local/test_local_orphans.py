"""Once a launcher exists, every way a local kernel ends stops it and frees its GPU: a release
in the very moment of admission or of a preemption, kernels started and deleted together, a
start that fails in jupyter_client after the launch returned. Each test ends by starting the
next kernel on the one GPU, and asserts no launcher of the ended kernel is left."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from kernel_queue.model import GroupPhase, GroupRef
from tests.conftest import KernelspecFactory, Server, launcher_pids

pytestmark = pytest.mark.local_gpus("0")


def ref_of(server: Server, kernel_id: str) -> GroupRef:
    groups = server.backend()._groups.values()
    return next(g.ref for g in groups if g.ref.kernel_id == kernel_id)


def release_on(server: Server, ref: GroupRef, phase: GroupPhase) -> tuple[Any, asyncio.Event]:
    """Follow the group and release it as soon as it reports `phase`, before anything else
    the backend scheduled for that moment runs (a watcher's wakeup comes first).

    The release comes from the backend's own API, as the server's shutdown makes it, so the
    kernel's restarter is stopped first, as that shutdown stops it: left running, it would see
    the released kernel ended and start it again, through the queue (a CI run's loaded machine
    once gave it the time to)."""
    server.app.kernel_manager.get_kernel(ref.kernel_id).stop_restarter()
    backend, following = server.backend(), asyncio.Event()

    async def run() -> None:
        async for status in backend.watch(ref):
            following.set()
            if status.phase is phase:
                await backend.release(ref)
                return

    return asyncio.get_running_loop().create_task(run()), following


async def assert_the_gpu_is_free(server: Server, name: str, *gone: str) -> None:
    """The next kernel gets the GPU and runs; the ended kernels left no launcher."""
    following = await server.start(name)
    assert (await server.execute(following, "1 + 1"))["data"] == "2"
    assert launcher_pids(gone) == set()
    await server.shutdown_and_wait(following)


async def test_a_release_in_the_moment_of_admission_starts_no_launcher(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    holder, queued = await server.hold_and_queue(name)
    releasing, following = release_on(server, ref_of(server, queued), GroupPhase.ADMITTED)
    await following.wait()
    await server.shutdown_and_wait(holder)  # admits `queued`, which is released at once
    await releasing
    await assert_the_gpu_is_free(server, name, queued)


async def test_a_kernel_released_while_it_is_preempted_never_comes_back(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    low = await server.start_running(kernelspec("low", gpus=1, priority_class="low"))
    releasing, following = release_on(server, ref_of(server, low), GroupPhase.EVICTED)
    await following.wait()
    high = await server.start(kernelspec("high", gpus=1, priority_class="high"))
    await releasing
    assert (await server.execute(high, "2"))["data"] == "2"
    await server.shutdown_and_wait(high)
    # Had `low` gone back to the queue, it would take the GPU now and the next kernel would wait.
    await assert_the_gpu_is_free(server, kernelspec("next", gpus=1, priority_class="low"), low)


async def test_two_kernels_started_and_deleted_together_leave_nothing(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    for _ in range(3):
        first, second = await asyncio.gather(server.start(name), server.start(name))
        await asyncio.gather(server.shutdown(first), server.shutdown(second))

        async def gone(ids: tuple[str, str] = (first, second)) -> bool:
            return not (await server.kernel_ids()) & set(ids) and not launcher_pids(ids)

        await server.wait_for(gone)
        assert server.backend()._groups == {}
    await assert_the_gpu_is_free(server, name, first, second)


async def test_a_start_that_fails_after_the_launch_returned_leaves_no_launcher(
    server: Server, kernelspec: KernelspecFactory, jp_runtime_dir: Path
) -> None:
    name = kernelspec(gpus=1)
    kernel_id = "0d1e2f3a-0000-4000-8000-000000000001"
    # jupyter_client writes the connection file once launch_kernel has returned: make it fail.
    (jp_runtime_dir / f"kernel-{kernel_id}.json").mkdir(parents=True)
    body = json.dumps({"name": name, "kernel_id": kernel_id})
    await server.fetch("api", "kernels", method="POST", body=body)

    async def dead() -> bool:
        return (await server.model(kernel_id))["execution_state"] == "dead"

    await server.wait_for(dead)
    await server.shutdown(kernel_id)
    async with asyncio.timeout(60):
        await assert_the_gpu_is_free(server, name, kernel_id)
