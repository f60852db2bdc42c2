"""A notebook that stays connected while its kernel is preempted and resumed reads the kernel
`idle` once it is back, without running a cell, and `busy` while a cell it sent meanwhile runs.

JupyterLab shows the last IOPub status whose parent is not one of the server's
`untracked_message_types` (kernel_info_request is one); ipykernel says only `starting` when it
starts, so a resumed kernel read "Starting" until the next cell (seen failing first).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import polling
from tests.conftest import EventLog, KernelspecFactory, Listener, Server

pytestmark = [pytest.mark.timeout(300), pytest.mark.local_gpus("0")]


def tracked(listener: Listener, untracked: list[str]) -> list[tuple[str, str | None]]:
    """The statuses JupyterLab acts on (its `_handleMessage`), with their parent's msg_type."""
    seen = []
    for msg in listener.messages:
        if msg.get("channel") != "iopub" or msg.get("msg_type") != "status":
            continue
        parent = msg.get("parent_header", {}).get("msg_type")
        if parent not in untracked:
            seen.append((msg["content"]["execution_state"], parent))
    return seen


def shown(listener: Listener, untracked: list[str]) -> str | None:
    """The kernel status JupyterLab shows after these messages."""
    statuses = tracked(listener, untracked)
    return statuses[-1][0] if statuses else None


class Preemptions:
    """Preempt `low` with a higher-priority kernel, and end that kernel to resume `low`."""

    def __init__(self, server: Server, kernelspec: KernelspecFactory, events: EventLog) -> None:
        self.server, self.events = server, events
        self.high = kernelspec("high", gpus=1, priority_class="high")

    async def preempt(self, low: str) -> str:
        high = await self.server.start(self.high)
        await self.server.wait_reason(low, "requeued")
        return high

    async def resume(self, low: str, high: str) -> None:
        resumes = self.events.states(low).count("resumed")
        await self.server.shutdown_and_wait(high)

        async def resumed() -> bool:
            return self.events.states(low).count("resumed") > resumes

        await self.server.wait_for(resumed)


async def test_a_connected_notebook_reads_idle_after_each_resume(
    server: Server,
    kernelspec: KernelspecFactory,
    event_log: EventLog,
    jp_serverapp: Any,
    tmp_path: Path,
) -> None:
    untracked = list(jp_serverapp.kernel_manager.untracked_message_types)
    checkpoint = {"enabled": True, "path": str(tmp_path / "store"), "grace_seconds": 60}
    low = await server.start(kernelspec("low", gpus=1, priority_class="low", checkpoint=checkpoint))
    assert (await server.execute(low, "x = 41"))["data"] is None
    cycles = Preemptions(server, kernelspec, event_log)
    listener = await Listener.open(server, low)
    try:
        for cycle in range(1, 3):
            await cycles.resume(low, await cycles.preempt(low))

            async def idle() -> bool:
                return shown(listener, untracked) == "idle"

            try:
                await server.wait_for(idle, within=20)
            except polling.NeverSaw:
                raise AssertionError(
                    f"after resume {cycle} the notebook would read "
                    f"{shown(listener, untracked)!r}: {tracked(listener, untracked)[-6:]}"
                ) from None
        assert (await server.execute(low, "x + 1"))["data"] == "42"
    finally:
        listener.close()
        await server.shutdown_and_wait(low)


async def test_a_cell_sent_while_requeued_reads_busy_until_it_ends(
    server: Server,
    kernelspec: KernelspecFactory,
    event_log: EventLog,
    jp_serverapp: Any,
) -> None:
    """The resumed kernel's own `idle` never comes between a held cell's busy and its end."""
    untracked = list(jp_serverapp.kernel_manager.untracked_message_types)
    low = await server.start(kernelspec("low", gpus=1, priority_class="low"))
    assert (await server.execute(low, "1"))["data"] == "1"
    cycles = Preemptions(server, kernelspec, event_log)
    listener = await Listener.open(server, low)
    try:
        high = await cycles.preempt(low)
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "version": "5.3"}
        header |= {"session": uuid.uuid4().hex, "username": "test", "date": ""}
        content = {"code": "import time; time.sleep(1)", "silent": False, "store_history": True}
        request = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
        await listener.ws.write_message(json.dumps({**request, "channel": "shell", "buffers": []}))
        await cycles.resume(low, high)

        async def ended() -> bool:
            return any(
                m.get("msg_type") == "status"
                and m["content"]["execution_state"] == "idle"
                and m.get("parent_header", {}).get("msg_id") == msg_id
                for m in listener.messages
            )

        await server.wait_for(ended, within=30)
        statuses = tracked(listener, untracked)
        assert ("busy", "execute_request") in statuses, statuses
        busy = statuses.index(("busy", "execute_request"))
        # The cell's busy may come twice: the kernel says it again when a subscription (this
        # server's activity watcher, say) arrived after the cell, and IOPub tells every client.
        after = statuses[busy:]
        assert after[-1] == ("idle", "execute_request"), statuses
        assert set(after[:-1]) == {("busy", "execute_request")}, statuses
        assert shown(listener, untracked) == "idle"
    finally:
        listener.close()
        await server.shutdown_and_wait(low)
