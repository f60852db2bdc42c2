"""Idle parking in the server: a kernel idle past its `park_after` parks and gives its GPU to the
next in line; never while a cell runs or its output streams, nor while a client keeps executing;
a websocket connects to a parked kernel at once without waking it; the next cell wakes it, waits
in the queue with its position, runs once and prints, with the variables all there.

Real server, real kernels; only the idle time passes at once, on the parker's virtual clock
(`tests/park/idle_time.py`). `park_after` is ten minutes, so no real wait in a test could park a
kernel: only the time a test lets pass does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernel_queue import lifecycle
from kernel_queue.server import kernels, parking
from tests.conftest import EventLog, KernelspecFactory, Listener, Server
from tests.local_parking import running, saving
from tests.park.idle_time import VirtualClock, idle_time_passes, on_virtual_time

pytestmark = pytest.mark.timeout(300)

PARK_AFTER = 600
IDLE = lifecycle.idle_words(PARK_AFTER)
"""How the parked reason says `PARK_AFTER` ("10 min")."""
LINES = 6
"""Lines the streaming thread prints, one each time half park_after has passed."""


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": ["0"]}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    # A nudge that waited for a parked kernel would hold a connection this long: far past the
    # test's own timeout, so only an answer without the kernel lets the test go on.
    jp_server_config["MappingKernelManager"]["kernel_info_timeout"] = 3600
    return jp_server_config


@pytest.fixture
def clock(server: Server) -> VirtualClock:
    return on_virtual_time(server)


@pytest.fixture
def parks_idle(kernelspec: KernelspecFactory, store: Path) -> str:
    """A kernelspec of one GPU whose kernels save checkpoints and park after `PARK_AFTER` idle."""
    return saving(kernelspec, store, "parks", park_after=PARK_AFTER)


async def settled(server: Server, kernel_id: str) -> None:
    """Wait until the server reads the kernel running and quiet, as the scan must to park it (a
    cell's reply can come before the idle status that ends it)."""
    km = server.app.kernel_manager.get_kernel(kernel_id)

    def quiet() -> bool:
        return parking.is_live(km) and km.execution_state in parking.QUIET_STATES

    await server.wait_for(quiet, what="the kernel running, its cells ended")


def streamed(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


def state(server: Server, kernel_id: str) -> str:
    status = kernels.queue_status(server.app.kernel_manager.get_kernel(kernel_id))
    return str((status or {}).get("state"))


async def test_an_idle_kernel_parks_its_gpu_goes_to_the_next_and_its_next_cell_wakes_it(
    server: Server,
    kernelspec: KernelspecFactory,
    parks_idle: str,
    event_log: EventLog,
    clock: VirtualClock,
) -> None:
    parks = await running(server, parks_idle, "x = 41; words = ['a', 'b']")
    waiting = await server.start(kernelspec("stays", gpus=1))
    await server.wait_reason(waiting, "position 1 of 1")
    await settled(server, parks)
    assert idle_time_passes(server, clock, PARK_AFTER - 1) == []
    assert idle_time_passes(server, clock, 1) == [parks]  # the waiting kernel is not idle

    model = await server.wait_reason(parks, "GPU released")
    assert model["reason"].startswith(f"parked after {IDLE} idle; GPU released; your next")
    assert "saved 2 variables" in model["reason"], model["reason"]
    gpu = await server.execute(waiting, "import os; os.environ['CUDA_VISIBLE_DEVICES']")
    assert gpu["data"] == "'0'"

    # A notebook opening the parked kernel connects at once and does not wake it.
    async with Listener.held(server, parks) as listener:
        assert state(server, parks) == "parked"
        cell = await listener.send("print('back', x + 1, words, flush=True)")
        model = await server.wait_reason(parks, "waking from parked")
        assert (
            model["reason"] == "waking from parked: queued in 'gpu', position 1 of 1, needs 1 GPU"
        )

        await server.shutdown_and_wait(waiting)  # its GPU goes back to the woken kernel
        messages = await listener.finished(server, cell)
        text = streamed(messages)
        # The restore's note, then the cell's own line, once, with the variables.
        assert text.startswith("restored 2 variables"), text
        assert text.endswith("\nback 42 ['a', 'b']\n") and text.count("back 42") == 1, text
        replies_ = [m for m in messages if m["msg_type"] == "execute_reply"]
        assert [m["content"]["status"] for m in replies_] == ["ok"]
    assert event_log.states(parks)[-4:] == ["parked", "requeued", "admitted", "resumed"]
    await server.shutdown_and_wait(parks)


async def test_a_kernel_never_parks_while_a_cell_runs_or_its_output_streams(
    server: Server, parks_idle: str, event_log: EventLog, clock: VirtualClock, tmp_path: Path
) -> None:
    kernel = await server.start(parks_idle)
    km = server.app.kernel_manager.get_kernel(kernel)
    go = tmp_path / "go"
    async with Listener.held(server, kernel) as listener:
        # A silent cell, running while three times park_after passes: busy throughout.
        silent = await listener.send(
            f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"
        )
        await server.wait_for(lambda: km.execution_state == "busy", what="the cell running")
        assert idle_time_passes(server, clock, 3 * PARK_AFTER) == []
        go.touch()
        await listener.finished(server, silent)
        # Output streaming from a thread after its cell ended: the kernel reads idle, but its
        # IOPub is busy. A line comes each time half park_after has passed (the test says when),
        # the last long after park_after since the cell ended.
        code = (
            "import os, threading, time\n"
            "def talk():\n"
            f"    for i in range({LINES}):\n"
            f"        while not os.path.exists(os.path.join({str(tmp_path)!r}, f'line{{i}}')):\n"
            "            time.sleep(0.05)\n"
            "        print(i, flush=True)\n"
            "threading.Thread(target=talk).start()"
        )
        streaming = await listener.send(code)
        await listener.finished(server, streaming)
        for line in range(LINES):
            before = km.last_activity
            (tmp_path / f"line{line}").touch()

            def seen(before: object = before) -> bool:
                return km.last_activity != before

            await server.wait_for(seen, what=f"line {line}'s IOPub message seen by the server")
            assert idle_time_passes(server, clock, PARK_AFTER / 2) == []

        def all_lines() -> bool:
            return streamed(listener.replies(streaming)).count("\n") == LINES

        await server.wait_for(all_lines)
        assert "parked" not in event_log.states(kernel)
        assert streamed(listener.replies(streaming)).split() == [str(i) for i in range(LINES)]
        # Quiet now: it parks.
        await settled(server, kernel)
        assert idle_time_passes(server, clock, PARK_AFTER) == [kernel]
        await server.wait_reason(kernel, f"parked after {IDLE} idle")
    await server.shutdown_and_wait(kernel)


async def test_a_kernel_whose_client_executes_every_half_park_after_never_parks(
    server: Server, parks_idle: str, event_log: EventLog, clock: VirtualClock
) -> None:
    kernel = await server.start(parks_idle)
    async with Listener.held(server, kernel) as listener:
        for number in range(8):  # four times park_after in all
            cell = await listener.send(f"{number} * 2")
            await listener.finished(server, cell)
            # the client's pace
            assert idle_time_passes(server, clock, PARK_AFTER / 2) == []
        assert "parked" not in event_log.states(kernel)
        assert state(server, kernel) in {"running", "resumed"}
    await server.shutdown_and_wait(kernel)


async def test_a_cell_sent_while_the_kernel_saves_to_park_runs_once_it_is_back(
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    checkpoint = {"enabled": True, "path": str(store), "grace_seconds": 60}
    kernel = await server.start(kernelspec("slow-save", gpus=1, checkpoint=checkpoint))
    async with Listener.held(server, kernel) as listener:
        # Enough to save that the park answers while the kernel still saves (202).
        setup = await listener.send("big = bytearray(400 * 2**20); big[-1] = 7")
        await listener.finished(server, setup)
        response = await server.fetch(
            "api", "kernel-queue", "kernels", kernel, "park", method="POST", body=""
        )
        assert response.code == 202, response.body  # parking: the old process still runs
        cell = await listener.send("print('after the park', big[-1], flush=True)")
        messages = await listener.finished(server, cell)
        assert streamed(messages).count("after the park 7\n") == 1, streamed(messages)
        assert [m["content"]["status"] for m in messages if m["msg_type"] == "execute_reply"] == [
            "ok"
        ]
    await server.shutdown_and_wait(kernel)


async def test_a_kernel_no_client_ever_spoke_to_parks_too(
    server: Server, parks_idle: str, clock: VirtualClock
) -> None:
    kernel = await server.start(parks_idle)
    await settled(server, kernel)
    assert idle_time_passes(server, clock, PARK_AFTER) == [kernel]
    await server.wait_reason(kernel, f"parked after {IDLE} idle; GPU released")
    await server.shutdown_and_wait(kernel)
