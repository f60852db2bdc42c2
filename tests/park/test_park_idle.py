"""Idle parking in the server: a kernel idle past its `park_after` parks and gives its GPU to the
next in line; never while a cell runs or its output streams, nor while a client keeps executing;
a websocket connects to a parked kernel at once without waking it; the next cell wakes it, waits
in the queue with its position, runs once and prints, with the variables all there."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kernel_queue.server import kernels
from tests.conftest import EventLog, KernelspecFactory, Listener, Server
from tests.local_parking import running, saving

pytestmark = pytest.mark.timeout(300)

PARK_AFTER = 2


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": ["0"]}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    # A nudge that waited for a parked kernel would hold a connection this long: far past the
    # test's own timeout, so only an answer without the kernel lets the test go on.
    jp_server_config["MappingKernelManager"]["kernel_info_timeout"] = 3600
    return jp_server_config


def streamed(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


def state(server: Server, kernel_id: str) -> str:
    status = kernels.queue_status(server.app.kernel_manager.get_kernel(kernel_id))
    return str((status or {}).get("state"))


async def test_an_idle_kernel_parks_its_gpu_goes_to_the_next_and_its_next_cell_wakes_it(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog, store: Path
) -> None:
    parks = await running(
        server,
        saving(kernelspec, store, "parks", park_after=PARK_AFTER),
        "x = 41; words = ['a', 'b']",
    )
    waiting = await server.start(kernelspec("stays", gpus=1))
    await server.wait_reason(waiting, "position 1 of 1")

    model = await server.wait_reason(parks, "GPU released")
    assert model["reason"].startswith(f"parked after {PARK_AFTER} s idle; GPU released; your next")
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
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog, store: Path
) -> None:
    kernel = await server.start(saving(kernelspec, store, "parks", park_after=PARK_AFTER))
    async with Listener.held(server, kernel) as listener:
        # A silent cell three times as long as park_after: the kernel is busy throughout.
        silent = await listener.send(f"import time; time.sleep({3 * PARK_AFTER}); 'slept'")
        await listener.finished(server, silent)
        # Output streaming from a thread after its cell ended: the kernel reads idle, but its
        # IOPub is busy; the last line comes well after park_after.
        code = (
            "import threading, time\n"
            "def talk():\n"
            f"    for i in range({6 * PARK_AFTER}):\n"
            "        print(i, flush=True); time.sleep(0.5)\n"
            "threading.Thread(target=talk).start()"
        )
        streaming = await listener.send(code)

        def all_lines() -> bool:
            return streamed(listener.replies(streaming)).count("\n") == 6 * PARK_AFTER

        await server.wait_for(all_lines, within=60)
        assert "parked" not in event_log.states(kernel)
        assert streamed(listener.replies(streaming)).split() == [
            str(i) for i in range(6 * PARK_AFTER)
        ]
        # Quiet now: it parks (the scan was running all along).
        await server.wait_reason(kernel, f"parked after {PARK_AFTER} s idle")
    await server.shutdown_and_wait(kernel)


async def test_a_kernel_whose_client_executes_every_second_never_parks(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog, store: Path
) -> None:
    kernel = await server.start(saving(kernelspec, store, "parks", park_after=PARK_AFTER))
    async with Listener.held(server, kernel) as listener:
        for number in range(4 * PARK_AFTER):
            cell = await listener.send(f"{number} * 2")
            await listener.finished(server, cell)
            await asyncio.sleep(1)  # the client's pace, not a wait for something
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
    server: Server, kernelspec: KernelspecFactory, store: Path
) -> None:
    kernel = await server.start(saving(kernelspec, store, "parks", park_after=PARK_AFTER))
    await server.wait_reason(kernel, f"parked after {PARK_AFTER} s idle; GPU released")
    await server.shutdown_and_wait(kernel)
