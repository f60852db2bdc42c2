"""The local backend and the machine's queue service it goes through: what a notebook sees when
the service dies, and that nothing is left behind."""

from __future__ import annotations

import os
import signal

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
