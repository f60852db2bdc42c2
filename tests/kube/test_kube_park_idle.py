"""Idle parking on the kubernetes backend through a real jupyter_server: a kernel idle past its
`park_after` parks (its pod saves to the claim, Kueue gives the GPU to the kernel waiting); a
notebook opening it connects without waking it; its next cell wakes it, waits in the queue with
its position, runs once and prints, with its variables; a shutdown then leaves nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import EventLog, KernelspecFactory, Listener, Server
from tests.kube.planes import Plane
from tests.kube.support import checkpointed, kube_spec, wait_clean

pytestmark = pytest.mark.timeout(300)
PARK_AFTER = 2


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    # A nudge that waited for a parked kernel would hold a connection this long (as in
    # tests/park/test_park_idle.py): only an answer without the kernel lets the test go on.
    jp_server_config["MappingKernelManager"]["kernel_info_timeout"] = 3600
    return jp_server_config


async def test_an_idle_pod_kernel_parks_gives_its_gpu_and_its_next_cell_wakes_it(
    server: Server, kernelspec: KernelspecFactory, plane: Plane, event_log: EventLog
) -> None:
    parks = await server.start(checkpointed(plane, kernelspec, "parks", park_after=PARK_AFTER))
    assert (await server.execute(parks, "x = 41; words = ['a', 'b']"))["status"] == "ok"
    waiting = await server.start(kube_spec(kernelspec, "stays"))
    await server.wait_reason(waiting, "position 1 of 1")

    model = await server.wait_reason(parks, "GPU released")
    assert model["reason"].startswith(f"parked after {PARK_AFTER} s idle; GPU released; your next")
    assert "saved 2 variables" in model["reason"], model["reason"]
    assert (await server.execute(waiting, "1 + 1"))["data"] == "2"  # it has the GPU

    listener = await Listener.open(server, parks)  # connects at once, does not wake it
    try:
        assert server.queue_state(parks) == "parked"
        cell = await listener.send("print('back', x + 1, words, flush=True)")
        await server.wait_reason(
            parks, "waking from parked: queued in 'user-queue', position 1 of 1"
        )
        await server.shutdown_and_wait(waiting)  # its GPU goes back to the woken kernel
        messages = await listener.finished(server, cell)
        text = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
        assert text.startswith("restored 2 variables"), text
        assert text.endswith("\nback 42 ['a', 'b']\n") and text.count("back 42") == 1, text
        replies = [m for m in messages if m["msg_type"] == "execute_reply"]
        assert [m["content"]["status"] for m in replies] == ["ok"]
    finally:
        listener.close()
    assert event_log.states(parks)[-4:] == ["parked", "requeued", "admitted", "resumed"]
    await server.shutdown_and_wait(parks)
    await wait_clean(server, plane, parks, waiting)
