"""Parking and jupyter_server's culler together, as the README tells admins to set them: with
`park_after` below `cull_idle_timeout` an idle kernel parks first (its GPU back at once) and the
culler ends it later, counting from its last activity, and its checkpoint goes with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import EventLog, KernelspecFactory, Server

CULL_IDLE_TIMEOUT = 8


pytestmark = pytest.mark.local_gpus("0")


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    jp_server_config["MappingKernelManager"].update(
        cull_idle_timeout=CULL_IDLE_TIMEOUT, cull_interval=1
    )
    return jp_server_config


async def test_an_idle_kernel_parks_first_and_the_culler_ends_it_later(
    server: Server, kernelspec: KernelspecFactory, event_log: EventLog, tmp_path: Path
) -> None:
    store = tmp_path / "checkpoints"
    checkpoint = {"enabled": True, "path": str(store), "grace_seconds": 60}
    name = kernelspec("parks", gpus=1, checkpoint=checkpoint, park_after=1)
    kernel = await server.start(name)
    assert (await server.execute(kernel, "x = 41"))["status"] == "ok"

    await server.wait_reason(kernel, "parked after 1 s idle; GPU released")
    assert (store / kernel).exists()  # what it saved, kept while it is parked

    async def culled() -> bool:
        return kernel not in await server.kernel_ids()

    await server.wait_for(culled, within=CULL_IDLE_TIMEOUT + 30)
    assert event_log.states(kernel)[-2:] == ["parked", "finished"]
    assert not (store / kernel).exists()
    assert not server.backend()._groups
