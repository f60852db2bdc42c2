"""The local backend and the machine's queue service it goes through: what a notebook sees when
the service dies, and that nothing is left behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import KernelspecFactory, Listener, Server, launcher_pids


def service_pid(server: Server) -> int:
    welcome = server.backend()._machine.service
    assert welcome is not None, "the backend never connected to the machine's queue"
    return int(welcome.pid)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["restart", "crash"])
async def test_a_restarted_service_is_not_an_outage(
    server: Server, kernelspec: KernelspecFactory, signum: signal.Signals
) -> None:
    """Three running kernels (two with a GPU each, one on CPU) and one waiting; the machine's
    service stops (a restart's SIGTERM, or a crash): the kernels keep running with their
    variables and GPUs, an open notebook keeps working, the waiting one keeps its place, and
    once a GPU frees it is admitted."""
    gpu, cpu = kernelspec("gpu", gpus=1), kernelspec("cpu", queue="cpu")
    first, second, third = [await server.start(name) for name in (gpu, gpu, cpu)]
    for number, kernel in enumerate((first, second, third)):
        assert (await server.execute(kernel, f"x = {number}; x"))["data"] == str(number)
    waiting = await server.start(gpu)
    await server.wait_reason(waiting, "position 1 of 1")
    launchers = {k: launcher_pids((k,)) for k in (first, second, third)}
    listener = await Listener.open(server, first)
    old = service_pid(server)
    os.kill(old, signum)

    async def back() -> bool:
        welcome = server.backend()._machine.service
        return welcome is not None and welcome.pid != old and _alive(welcome.pid)

    await server.wait_for(back, what="the backend connected to a new service")
    listing = await server.backend().machine_queue()
    assert sorted((k["kernel_id"], k["state"]) for k in listing["kernels"]) == sorted(
        [(first, "admitted"), (second, "admitted"), (third, "admitted"), (waiting, "queued")]
    ), listing
    for number, kernel in enumerate((first, second, third)):
        assert (await server.execute(kernel, "x"))["data"] == str(number)  # the same kernels
        assert launcher_pids((kernel,)) == launchers[kernel]
    listener.close()
    assert "position 1 of 1" in (await server.model(waiting))["reason"]
    await server.shutdown(first)
    assert (await server.execute(waiting, "7"))["data"] == "7"
    await server.shutdown_and_wait(second, third, waiting)


async def test_a_service_that_does_not_come_back_ends_the_leases_with_a_sentence(
    server: Server, kernelspec: KernelspecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernel_queue.backends.local import machine_link
    from kernel_queue.machine import client

    monkeypatch.setattr(machine_link, "RECONNECT_SECONDS", 2.0)
    running = await server.start_running(kernelspec(gpus=1))
    old = service_pid(server)

    def no_service(path: Path) -> None:
        raise OSError("no service may start in this test")

    monkeypatch.setattr(client, "start_service", no_service)
    os.kill(old, signal.SIGKILL)
    model = await server.wait_reason(running, "lease ended")
    assert model["reason"].startswith(
        f"kernel {running[:8]} failed: the machine's kernel-queue service (pid {old}) closed the "
        "connection, and no service answered within 2 s"
    ), model["reason"]
    await server.wait_for(lambda: not launcher_pids((running,)), what="its launcher stopped")
    await server.shutdown_and_wait(running)


async def test_a_preempted_launcher_that_never_answers_loses_its_gpu_after_its_grace(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    checkpoint = {"enabled": True, "grace_seconds": 4}
    low = await server.start_running(
        kernelspec("low", gpus=2, priority_class="low", checkpoint=checkpoint)
    )
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


async def test_a_server_stopped_with_no_kernel_closes_its_backends(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    """jupyter_server's cleanup skipped shutdown_all for a kernel manager with no kernels (it
    was false): the backend's connection to the machine's queue service stayed open for the
    process's life, and with it the service."""
    from kernel_queue import backends

    kernel = await server.start(kernelspec("cleanup", gpus=1))
    await server.shutdown_and_wait(kernel)
    manager = server.app.kernel_manager
    assert manager in backends._shared  # the backend its kernel used
    await server.app.cleanup_kernels()  # as the server does when it stops
    assert manager not in backends._shared
