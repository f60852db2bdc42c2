"""Preemption becomes a pause on the local backend: the kernel saves its variables, requeues,
and resumes with them restored, telling the user what was and was not restored."""

from __future__ import annotations

import asyncio
import types
from pathlib import Path
from typing import Any

import pytest

import kernel_queue.checkpoint as kc
from kernel_queue.checkpoint.stores import PARTIAL
from tests.checkpoint_scenario import (
    CHECK,
    EXPECTED,
    LOOP,
    NOT_RESTORED,
    NOT_SAVED,
    PREEMPTED_NOTICE,
    RESTORED,
    SAVED,
    SETUP,
    private_modes,
)
from tests.conftest import EventLog, KernelspecFactory, Listener, Server

pytestmark = pytest.mark.local_gpus("0")


def checkpointed(kernelspec: KernelspecFactory, store: Path, **extra: Any) -> str:
    checkpoint = {"enabled": True, "path": str(store), "grace_seconds": 60, **extra}
    return kernelspec("low", gpus=1, priority_class="low", checkpoint=checkpoint)


async def preempt(server: Server, kernelspec: KernelspecFactory) -> str:
    """Start a higher-priority kernel on the only GPU; return it once it runs code."""
    high = await server.start(kernelspec("high", gpus=1, priority_class="high"))
    assert (await server.execute(high, "1+1"))["data"] == "2"
    return high


async def test_an_idle_kernel_saves_requeues_and_resumes_with_its_variables(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog, tmp_path: Path
) -> None:
    store = tmp_path / "checkpoints"
    low = await server.start(checkpointed(kernelspec, store))
    assert (await server.execute(low, SETUP))["status"] == "ok"
    listener = await Listener.open(server, low)
    try:
        high = await preempt(server, kernelspec)

        async def told() -> bool:
            return NOT_SAVED in listener.text() and PREEMPTED_NOTICE in listener.text()

        await server.wait_for(told, within=60)
        text = listener.text()
        # told first, and by whom: the kernel that takes its GPU
        assert f"{PREEMPTED_NOTICE}{high[:8]}" in text, text
        assert text.index(PREEMPTED_NOTICE) < text.index(SAVED), text
    finally:
        listener.close()
    model = await server.wait_reason(low, "requeued")
    assert SAVED in model["reason"], model["reason"]
    assert private_modes(store) == ({0o700}, {0o600})

    await server.shutdown_and_wait(high)
    first = await server.execute(low, CHECK)
    assert first["data"] == EXPECTED
    assert RESTORED in first["stream"]
    assert NOT_RESTORED in first["stream"]
    second = await server.execute(low, "sock")
    assert second["error"] == "NameError"
    assert "restored" not in second["stream"]  # the summary is shown once
    states = event_log.states(low)
    assert states[-4:] == ["preempted", "requeued", "admitted", "resumed"]
    resumed = [e for e in event_log.events if e["kernel_id"] == low and e["state"] == "resumed"]
    assert "variables restored from the checkpoint" in resumed[-1]["message"]

    await server.shutdown_and_wait(low)
    assert not (store / low).exists()  # deleted at shutdown unless checkpoint.keep


async def test_a_running_loop_is_stopped_on_its_cell_and_its_progress_is_kept(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    low = await server.start(checkpointed(kernelspec, tmp_path / "checkpoints"))
    listener = await Listener.open(server, low)
    try:
        running = asyncio.ensure_future(server.execute(low, LOOP, within=120))

        async def looping() -> bool:
            return "looping" in listener.text()

        await server.wait_for(looping, within=60)
        high = await preempt(server, kernelspec)
        stopped = await running
    finally:
        listener.close()
    assert stopped["status"] == "error"
    assert stopped["error"] == "Preempted"  # the user sees it on the cell that was running
    assert "looping" in stopped["stream"]
    model = await server.wait_reason(low, "requeued")
    assert "saved 1 variable" in model["reason"], model["reason"]

    await server.shutdown_and_wait(high)
    back = await server.execute(low, "i > 1000")
    assert back["data"] == "True", back
    assert "restored 1 variable" in back["stream"]
    assert "mid-update" not in back["stream"]  # saved at the cell boundary, not concurrently
    await server.shutdown_and_wait(low)


async def test_with_keep_the_checkpoint_outlives_the_kernel(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    store = tmp_path / "checkpoints"
    low = await server.start(checkpointed(kernelspec, store, keep=True))
    assert (await server.execute(low, "answer = 42"))["status"] == "ok"
    high = await preempt(server, kernelspec)
    await server.wait_reason(low, "requeued")
    await server.shutdown_and_wait(high)
    assert (await server.execute(low, "answer"))["data"] == "42"
    await server.shutdown_and_wait(low)
    newest = kc.DirectoryStore(store / low).committed()[-1]  # the preemption's or a later cell's
    kept = types.ModuleType("__main__")
    kc.restore(kept, newest)
    assert kept.answer == 42


def committed(store: Path) -> list[Path]:
    """The manifests of committed checkpoints: not one of a `.partial` directory, which a save
    still writes and renames when it commits."""
    found = store.rglob("manifest.json")
    return sorted(p for p in found if not p.parent.name.endswith(PARTIAL))


async def test_a_user_restart_neither_saves_nor_restores(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    store = tmp_path / "checkpoints"
    low = await server.start(checkpointed(kernelspec, store))
    assert (await server.execute(low, "answer = 42"))["status"] == "ok"
    await server.wait_for(lambda: committed(store), what="the cell's checkpoint")
    [own] = committed(store)
    # A checkpoint not yet restored, as a preemption would leave: only the restart's own
    # generation keeps the new kernel process from restoring it.
    state = types.ModuleType("__main__")
    state.answer = 7
    report = kc.save(state, kc.DirectoryStore(store / low))
    planted = report.checkpoint
    assert planted is not None, report.error
    before = committed(store)
    response = await server.fetch("api", "kernels", low, "restart", method="POST", body="")
    assert response.code == 200
    back = await server.execute(low, "answer")
    assert back["error"] == "NameError"
    assert "restored" not in back["stream"]
    assert committed(store) == before  # the restart saved nothing
    # the kernel's own newest checkpoint (the cell's) is marked: a later relaunch (after a kill)
    # must not roll the fresh kernel back to it
    assert (own.parent / "restored").exists()
    await server.shutdown_and_wait(low)
