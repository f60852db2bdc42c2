"""A local kernel's ports cannot be stolen while it waits, and a port taken while it starts is
named: real jupyter_server, real launchers and kernels, a second socket playing the thief."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KernelspecFactory, Server, launcher_pids

SLOW_KERNEL = """\
import os, runpy, sys, time
while not os.path.exists(os.environ["KQ_TEST_GO"]):  # the test says when the kernel may bind
    time.sleep(0.05)
sys.argv[0] = "kernel_queue.launcher.kernel"
runpy.run_module("kernel_queue.launcher.kernel", run_name="__main__", alter_sys=True)
"""


pytestmark = pytest.mark.local_gpus("0")


def steal(port: int, *, reuse: bool) -> socket.socket | None:
    """Bind and listen on 127.0.0.1:`port` as another program would; None if refused."""
    thief = socket.socket()
    if reuse:  # as ZMQ, asyncio and most servers do
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        thief.bind(("127.0.0.1", port))
        thief.listen()
    except OSError:
        thief.close()
        return None
    return thief


def ports_of(server: Server, kernel_id: str) -> tuple[int, ...]:
    """The ports the backend gave the kernel (a pending kernel has no connection file yet)."""
    groups = server.backend()._groups.values()
    return next(tuple(g.ref.connection.ports) for g in groups if g.ref.kernel_id == kernel_id)


def try_to_steal(ports: tuple[int, ...]) -> list[socket.socket]:
    return [t for p in ports for r in (False, True) if (t := steal(p, reuse=r)) is not None]


@contextlib.contextmanager
def nobody_else_can_take(ports: tuple[int, ...]) -> Iterator[None]:
    """Try to take each port (with and without SO_REUSEADDR): none may be taken; what was
    taken anyway is given back when the block ends."""
    stolen = try_to_steal(ports)
    try:
        assert [t.getsockname() for t in stolen] == []
        yield
    finally:
        for thief in stolen:
            thief.close()


async def test_the_ports_of_a_queued_kernel_cannot_be_taken_and_it_runs_there_once_admitted(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    holder, queued = await server.hold_and_queue(name)
    ports = ports_of(server, queued)
    with nobody_else_can_take(ports):
        await server.shutdown(holder)
        result = await server.execute(queued, "print('hello'); 6 * 7")
        assert (result["stream"], result["data"]) == ("hello\n", "42")
        info = server.app.kernel_manager.get_kernel(queued).get_connection_info()
        assert tuple(info[f"{n}_port"] for n in ("shell", "iopub", "stdin", "control", "hb")) == (
            ports
        )
    await server.shutdown_and_wait(queued)


async def test_the_ports_of_a_preempted_kernel_cannot_be_taken_and_it_resumes_there(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    low = await server.start_running(kernelspec("low", gpus=1, priority_class="low"))
    ports = ports_of(server, low)
    high = await server.start(kernelspec("high", gpus=1, priority_class="high"))
    assert (await server.execute(high, "2"))["data"] == "2"
    await server.wait_reason(low, "requeued")
    with nobody_else_can_take(ports):
        await server.shutdown_and_wait(high)
        result = await server.execute(low, "print('back'); 6 * 7")
        assert (result["stream"], result["data"]) == ("back\n", "42")
        assert ports_of(server, low) == ports
    await server.shutdown_and_wait(low)


def slow_kernelspec(kernelspec: KernelspecFactory, jp_kernel_dir: Path, go: Path) -> str:
    """A queued kernelspec whose kernel binds its ports only once `go` exists."""
    name = kernelspec("slow", gpus=0)
    folder = jp_kernel_dir / name
    (folder / "slow_kernel.py").write_text(SLOW_KERNEL)
    spec = json.loads((folder / "kernel.json").read_text())
    spec["argv"] = ["python", "{resource_dir}/slow_kernel.py", "-f", "{connection_file}"]
    spec["env"] = {"KQ_TEST_GO": str(go)}
    (folder / "kernel.json").write_text(json.dumps(spec))
    return name


async def launched_unbound(
    server: Server, kernelspec: KernelspecFactory, jp_kernel_dir: Path, go: Path
) -> tuple[str, str, int]:
    """A kernel of `slow_kernelspec` whose launcher runs while its kernel has bound nothing yet:
    the kernelspec's name, the kernel's id and its shell port."""
    name = slow_kernelspec(kernelspec, jp_kernel_dir, go)
    kernel = await server.start(name)
    await server.wait_for(lambda: bool(launcher_pids((kernel,))), what="the launcher running")
    return name, kernel, ports_of(server, kernel)[0]


async def died(server: Server, kernel: str) -> str:
    """Wait until the kernel is dead: its reason."""

    async def dead() -> bool:
        return (await server.model(kernel))["execution_state"] == "dead"

    await server.wait_for(dead)
    return str((await server.model(kernel))["reason"])


async def test_a_port_taken_while_the_kernel_starts_is_named_and_the_next_start_moves(
    server: Server, kernelspec: KernelspecFactory, jp_kernel_dir: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    name, kernel, shell = await launched_unbound(server, kernelspec, jp_kernel_dir, go)
    # Between the launcher's start and the kernel's bind, only a program that sets
    # SO_REUSEADDR can bind a port; this one then listens first.
    thief = steal(shell, reuse=True)
    assert thief is not None
    try:
        go.touch()
        assert (await died(server, kernel)).startswith(
            f"kernel {kernel[:8]} failed: the kernel exited with code 1: port {shell} (shell) "
            "on 127.0.0.1 is taken by another process, so the kernel could not listen there; "
            "start the kernel again and it gets new ports"
        )
        assert launcher_pids((kernel,)) == set()
        again = await server.start(name)
        assert (await server.execute(again, "6 * 7"))["data"] == "42"
        assert shell not in ports_of(server, again)
    finally:
        thief.close()
    await server.shutdown_and_wait(again)


THIEF = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1])))\n"
    "s.listen()\n"
    "print('listening', flush=True)\n"
    "time.sleep(120)\n"
)


async def test_a_port_another_process_took_is_named_with_that_process(
    server: Server, kernelspec: KernelspecFactory, jp_kernel_dir: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    _, kernel, shell = await launched_unbound(server, kernelspec, jp_kernel_dir, go)
    thief = await asyncio.create_subprocess_exec(
        sys.executable, "-c", THIEF, str(shell), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert thief.stdout is not None
        assert await asyncio.wait_for(thief.stdout.readline(), 30) == b"listening\n"
        go.touch()
        reason = await died(server, kernel)
        assert f"port {shell} (shell; held by pid {thief.pid}: {sys.executable} -c " in reason, (
            reason
        )
    finally:
        thief.kill()
        await thief.wait()
    await server.shutdown_and_wait(kernel)
