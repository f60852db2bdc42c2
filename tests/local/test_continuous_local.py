"""A kernel killed without warning on the local backend (SIGKILL of the kernel process, as the OOM
killer does) comes back through Jupyter's restarter as of its last saved cell, and says so."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import kernel_queue.checkpoint as kc
from tests.conftest import KernelspecFactory, Server, launcher_pids
from tests.continuous import CELLS, run

pytestmark = pytest.mark.local_gpus("0")


def children(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


async def test_a_kernel_killed_after_five_cells_is_restarted_as_of_the_fifth(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    store = tmp_path / "checkpoints"
    checkpoint = {"enabled": True, "path": str(store), "grace_seconds": 60}
    kernel_id = await server.start(kernelspec("low", gpus=1, checkpoint=checkpoint))
    for number, cell in enumerate(CELLS, 1):
        reply = await run(server, kernel_id, cell)
        assert (reply["status"], reply["count"]) == ("ok", number)
    (launcher,) = launcher_pids((kernel_id,))
    (pid,) = children(launcher)  # the kernel process

    def fifth_saved() -> bool:
        found = kc.DirectoryStore(store / kernel_id).committed()
        return bool(found) and found[-1].manifest.get("cell") == len(CELLS)

    await server.wait_for(fifth_saved, what="the last cell's checkpoint")

    before = {launcher}
    address = server.app.kernel_manager.get_kernel(kernel_id).get_connection_info()
    os.kill(pid, signal.SIGKILL)  # no SIGTERM: nothing is saved now

    def relaunched() -> bool:
        return bool(launcher_pids((kernel_id,)) - before)

    await server.wait_for(relaunched, what="the kernel's launcher started again")
    first = await run(server, kernel_id, "(x, float(a[0]), float(b[1]))")
    # back on the same ports: a client on the old ones reconnects by itself
    assert server.app.kernel_manager.get_kernel(kernel_id).get_connection_info() == address
    assert first["data"] == "(5, 7.0, 1.0)", first
    assert "restored 3 variables (4.2 MB) as of cell [5]" in first["stream"], first["stream"]
    assert "Restored: a, b, x." in first["stream"]
    assert "the kernel then stopped without warning" in first["stream"], first["stream"]
    await server.shutdown_and_wait(kernel_id)
