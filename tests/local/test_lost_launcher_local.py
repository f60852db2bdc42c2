"""A lost launcher is a pause, not a loss (local backend; issue 27): a launcher killed without
warning (SIGKILL, as the OOM killer does, or any other signal nobody of ours sent) takes its
kernel with it, and the kernel comes back, queued again, as of its last committed checkpoint,
on the same ports, its first cell saying which cell the values are from and that the kernel
stopped without warning; a cell that was running is the only thing lost. 20 kills: 10 while
the kernel idles, 10 while a cell runs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import kernel_queue.checkpoint as kc
from kernel_queue.backends.local import groups
from tests.conftest import EventLog, KernelspecFactory, Server, launcher_pids
from tests.continuous import run
from tests.messages import execute_request

pytestmark = [pytest.mark.timeout(900), pytest.mark.local_gpus("0")]

KILLS = 10


async def _running_cell(server: Server, kernel_id: str, code: str) -> Any:
    """Send `code` through a websocket and return once the kernel says it is busy with it; the
    websocket (the caller closes it)."""
    ws = await server.ws_fetch("api", "kernels", kernel_id, "channels")
    request = execute_request(code)
    msg_id = request["header"]["msg_id"]
    async with asyncio.timeout(60):
        await ws.write_message(json.dumps(request))
        while True:
            msg = json.loads(await ws.read_message())
            if (
                msg.get("parent_header", {}).get("msg_id") == msg_id
                and msg["msg_type"] == "execute_input"
            ):
                return ws


@pytest.mark.parametrize("when", ["idle", "in-a-cell"])
async def test_a_killed_launcher_comes_back_from_its_last_save_on_the_same_ports(
    server: Server,
    kernelspec: KernelspecFactory,
    tmp_path: Path,
    when: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ten losses in well under a minute: each counted alone here (the limit of three a minute
    # is the next test's)
    monkeypatch.setattr(groups, "LOSS_WINDOW_SECONDS", 0.0)
    store = tmp_path / "checkpoints"
    checkpoint = {"enabled": True, "path": str(store), "grace_seconds": 30}
    kernel_id = await server.start(kernelspec("saved", gpus=1, checkpoint=checkpoint))
    assert (await run(server, kernel_id, "1"))["status"] == "ok"
    address = server.app.kernel_manager.get_kernel(kernel_id).get_connection_info()
    for number in range(KILLS):
        before = {c.id for c in kc.DirectoryStore(store / kernel_id).committed()}
        reply = await run(server, kernel_id, f"x = {number}")
        assert reply["status"] == "ok", reply
        cell = reply["count"]

        def saved(cell: int = cell, before: set[str] = before) -> bool:
            found = kc.DirectoryStore(store / kernel_id).committed()
            newest = found[-1] if found else None
            return (
                newest is not None
                and newest.id not in before
                and newest.manifest.get("cell") == cell
            )

        await server.wait_for(saved, what=f"cell [{cell}]'s checkpoint committed")
        held = (
            await _running_cell(server, kernel_id, "import time; time.sleep(600)")
            if when != "idle"
            else None
        )
        (launcher,) = launcher_pids((kernel_id,))
        os.kill(launcher, signal.SIGKILL)

        def relaunched(before: int = launcher) -> bool:
            return bool(launcher_pids((kernel_id,)) - {before})

        await server.wait_for(relaunched, what="the kernel's launcher started again")
        if held is not None:
            held.close()
        first = await run(server, kernel_id, "x")
        assert first["data"] == str(number), first
        assert f"as of cell [{cell}]" in first["stream"], first["stream"]
        assert "stopped without warning" in first["stream"], first["stream"]
        now = server.app.kernel_manager.get_kernel(kernel_id).get_connection_info()
        assert now == address  # the same ports: clients on the old ones reconnect by themselves
    await server.shutdown_and_wait(kernel_id)
    assert not (store / kernel_id).exists()


async def test_a_kernel_lost_four_times_in_a_minute_is_not_brought_back_again(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path, event_log: EventLog
) -> None:
    """(A restore that crashes the kernel would otherwise bring it back forever.) The fourth
    loss ends it with a sentence; jupyter's restarter then starts it fresh, as it does any
    kernel that died."""
    checkpoint = {"enabled": True, "path": str(tmp_path / "checkpoints"), "grace_seconds": 30}
    kernel_id = await server.start(kernelspec("saved", gpus=1, checkpoint=checkpoint))
    for _ in range(4):
        assert (await run(server, kernel_id, "x = 1"))["status"] == "ok"
        (launcher,) = launcher_pids((kernel_id,))
        os.kill(launcher, signal.SIGKILL)
        await server.wait_for(
            lambda before=launcher: bool(launcher_pids((kernel_id,)) - {before}),
            what="a launcher started again",
        )
    failed = [e for e in event_log.events if e["kernel_id"] == kernel_id and e["state"] == "failed"]
    (message,) = [e["message"] for e in failed]
    assert message.startswith(
        f"kernel {kernel_id[:8]} failed: it stopped without warning 4 times within a minute, "
        "the last time because its launcher was killed by SIGKILL (exit 137); it is not "
        "brought back again: start it again, and look at its log; last lines of "
    ), message
    assert (await run(server, kernel_id, "x"))["status"] == "error"  # fresh: nothing restored
    await server.shutdown_and_wait(kernel_id)
