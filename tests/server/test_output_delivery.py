"""Every cell's output reaches every client that was connected: after a fresh start, a restart in
place and a resume after preemption, through the server's websocket (JupyterLab's path) and
through a direct jupyter_client. jupyter_client's LocalProvisioner runs the same start and
restart checks as the control. The guarantee lives in the kernel: each execute_request waits
until IOPub subscriptions have settled (`kernel_queue.launcher.subscriptions`)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.conftest import KernelspecFactory, Server
from tests.server.clients import Direct, both_see, cell, held, lost_across_resumes

pytestmark = pytest.mark.timeout(600)

FIRST_CELLS = 50
RESUMES = 20


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": ["0", "1", "2"]}


def plain_kernelspec(kernel_dir: Path) -> str:
    """The control: ipykernel through jupyter_client's LocalProvisioner."""
    folder = kernel_dir / "plain"
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "plain", "language": "python"}
    (folder / "kernel.json").write_text(json.dumps(spec))
    return "plain"


def kernel_named(kind: str, kernelspec: KernelspecFactory, kernel_dir: Path) -> str:
    if kind == "plain":
        return plain_kernelspec(kernel_dir)
    if kind == "gpu":
        return kernelspec("gpu", gpus=1)
    return kernelspec("cpu", queue="cpu")


@pytest.mark.parametrize("kind", ["gpu", "cpu", "plain"])
async def test_the_first_cell_after_a_start_loses_no_output(
    server: Server, kernelspec: KernelspecFactory, jp_kernel_dir: Path, kind: str
) -> None:
    """Kernels started two and three at a time; the first cell of each, half through a new
    websocket, half through a direct client."""
    name = kernel_named(kind, kernelspec, jp_kernel_dir)
    lost: list[str] = []
    started = 0
    while started < FIRST_CELLS:
        batch = 2 if (started // 5) % 2 == 0 else 3
        ids = await asyncio.gather(*(server.start(name) for _ in range(batch)))
        found = await asyncio.gather(
            *(first_cell(server, kernel_id, started + i) for i, kernel_id in enumerate(ids))
        )
        lost += [problem for problem in found if problem]
        await server.shutdown_and_wait(*ids)
        started += batch
    assert lost == [], f"{len(lost)} of {started} first cells lost output: {lost}"


async def first_cell(server: Server, kernel_id: str, number: int) -> str:
    """Run the kernel's first cell, through a new websocket (even numbers) or a new direct
    client; what was lost, or ""."""
    code, want = cell(f"k{number}", number)
    if number % 2 == 0:
        result = await server.execute(kernel_id, code)
        got = (result["stream"], result["data"])
    else:
        await server.wait_for(lambda: _ready(server, kernel_id))
        info = _connection(server, kernel_id)
        try:
            got = await direct_cell(server, kernel_id, code)
        except (zmq.Again, RuntimeError):
            if _connection(server, kernel_id) == info:
                raise
            # jupyter_client's own race, met only by the plain control (our kernels bind their
            # own ports): LocalProvisioner picks free ports, closes them and starts the
            # kernel, and a busy machine's other processes may take one first; the kernel
            # dies and jupyter's restarter starts it again on new ports. A console user
            # connects again with the new connection file; so does this client.
            got = await direct_cell(server, kernel_id, code)
    return "" if got == want else f"kernel {number}: {got!r}"


async def direct_cell(server: Server, kernel_id: str, code: str) -> tuple[str, str | None]:
    async with Direct(server, kernel_id) as direct:
        return await direct.outputs(direct.send(code))


def _connection(server: Server, kernel_id: str) -> dict[str, Any]:
    return dict(server.app.kernel_manager.get_kernel(kernel_id).get_connection_info())


async def _ready(server: Server, kernel_id: str) -> bool:
    ready = server.app.kernel_manager.get_kernel(kernel_id).ready
    return bool(ready.done())


async def test_the_first_cell_after_a_restart_in_place_loses_no_output(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    """(No control here: a direct client of a plain ipykernel does lose the first cell's output
    after a restart, as it reconnects.)"""
    kernel_id = await server.start(kernelspec(gpus=1))
    assert (await server.execute(kernel_id, "1"))["data"] == "1"
    lost: list[str] = []
    async for socket, direct in held(server, kernel_id):
        for number in range(5):
            await server.fetch("api", "kernels", kernel_id, "restart", method="POST", body="")
            lost += await both_see(server, socket, direct, number, f"restart {number}")
    assert lost == []
    await server.shutdown_and_wait(kernel_id)


@pytest.mark.parametrize("local_backend_config", [{"gpus": ["0"]}], ids=["one-gpu"])
async def test_the_first_cell_after_a_resume_loses_no_output(
    server: Server, kernelspec: KernelspecFactory, local_backend_config: dict[str, Any]
) -> None:
    """A cell sent while the kernel waits in the queue again runs once it is back, and both
    held clients see its output, every time."""
    low = await server.start(kernelspec("low", gpus=1, priority_class="low"))
    assert (await server.execute(low, "1"))["data"] == "1"
    high_name = kernelspec("high", gpus=1, priority_class="high")
    lost = await lost_across_resumes(server, low, high_name, RESUMES, server.shutdown_and_wait)
    assert lost == [], f"{len(lost)} of {2 * RESUMES} cells lost output: {lost}"
    await server.shutdown_and_wait(low)
