"""The local backend and the machine's queue service it goes through: what a notebook sees when
the service dies, and that nothing is left behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.conftest import KernelspecFactory, Server, launcher_pids


def service_pid(server: Server) -> int:
    welcome = server.backend()._machine.service
    assert welcome is not None, "the backend never connected to the machine's queue"
    return int(welcome.pid)


async def test_a_killed_service_ends_its_kernels_with_a_sentence_and_the_next_start_starts_one(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    running = await server.start(name)
    assert (await server.execute(running, "1+1"))["data"] == "2"
    other = await server.start(name)  # holds the other GPU
    second = await server.start(name)
    await server.wait_reason(second, "position 1 of 1")
    old = service_pid(server)
    os.kill(old, signal.SIGKILL)

    model = await server.wait_reason(running, "closed the connection")
    assert (
        f"the machine's kernel-queue service (pid {old}) closed the connection" in model["reason"]
    )
    await server.wait_reason(second, "closed the connection")

    async def no_launchers() -> bool:
        return not launcher_pids((running, other, second))

    await server.wait_for(no_launchers)
    again = await server.start(name)
    assert (await server.execute(again, "2+2"))["data"] == "4"
    assert service_pid(server) != old
    await server.shutdown_and_wait(again)


async def test_a_preempted_launcher_that_never_answers_loses_its_gpu_after_its_grace(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    checkpoint = {"enabled": True, "grace_seconds": 4}
    low = await server.start(kernelspec("low", gpus=2, priority_class="low", checkpoint=checkpoint))
    assert (await server.execute(low, "1"))["data"] == "1"
    (stuck,) = launcher_pids((low,))
    os.kill(stuck, signal.SIGSTOP)  # it can no longer save, exit or answer anything
    try:
        high = await server.start(kernelspec("high", gpus=1, priority_class="high"))
        # Its 4 s of grace and the 1 s margin pass, the machine's queue takes the GPUs back,
        # and this server kills the launcher that kept them.
        assert (await server.execute(high, "2"))["data"] == "2"
        assert not _alive(stuck)
    finally:
        if _alive(stuck):
            os.kill(stuck, signal.SIGKILL)
    model = await server.wait_reason(low, "requeued")
    assert "preempted" in model["reason"] and "position 1 of 1" in model["reason"]
    await server.shutdown(high)
    back = await server.execute(low, "3")
    assert back["data"] == "3"
    await server.shutdown_and_wait(low)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
