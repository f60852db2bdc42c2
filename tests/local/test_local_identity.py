"""Kernel ids a client chooses (`POST /api/kernels {"kernel_id": ...}`) on the local backend:
each id is its own kernel, and an id that is not a lowercase UUID is refused before anything
of ours exists."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server, launcher_pids

# Two ids that agree on their first eight hex digits (the old short id) and differ after.
TWIN_A = "1a2b3c4d-0000-4000-8000-00000000000a"
TWIN_B = "1a2b3c4d-0000-4000-8000-00000000000b"


async def test_two_kernels_whose_ids_share_their_first_eight_hex_digits_are_two_kernels(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=0)
    assert await server.start(name, TWIN_A) == TWIN_A
    assert (await server.execute(TWIN_A, "secret = 'only in a'; 1"))["data"] == "1"
    assert await server.start(name, TWIN_B) == TWIN_B
    # The second kernel is a kernel of its own: it does not see the first one's variables.
    assert (await server.execute(TWIN_B, "secret"))["error"] == "NameError"
    pids = "import os; os.getpid()"
    assert (await server.execute(TWIN_A, pids))["data"] != (await server.execute(TWIN_B, pids))[
        "data"
    ]
    await server.shutdown_and_wait(TWIN_A)
    # Shutting the first one down leaves the second one running.
    assert (await server.execute(TWIN_B, "2 + 2"))["data"] == "4"
    await server.shutdown_and_wait(TWIN_B)


@pytest.fixture
def local_backend_config(tmp_path: Path) -> dict[str, Any]:
    return {
        "gpus": ["0"],
        "checkpoint_root": str(tmp_path / "root" / "checkpoints"),
        "log_dir": str(tmp_path / "root" / "logs"),
    }


@pytest.mark.parametrize(
    "kernel_id",
    [
        pytest.param("../victim", id="parent-dir"),
        pytest.param("a/b", id="slash"),
        pytest.param("1A2B3C4D-0000-4000-8000-00000000000A", id="upper-case"),
        pytest.param("1a2b3c4d000040008000000000000000", id="no-hyphens"),
        pytest.param("1a2b3c4d-0000-4000-8000-00000000000a\n", id="newline"),
        pytest.param("x" * 300, id="long"),
    ],
)
async def test_a_kernel_id_that_is_not_a_lowercase_uuid_is_refused_and_creates_nothing(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path, kernel_id: str
) -> None:
    name = kernelspec(gpus=1, checkpoint={"enabled": True})
    victim = tmp_path / "root" / "victim"  # what `<checkpoint root>/../victim` would name
    victim.mkdir(parents=True)
    (victim / "precious").write_text("keep me")
    started = await server.start(name, kernel_id)
    model: dict[str, Any] = {}

    async def dead() -> bool:
        models = json.loads((await server.fetch("api", "kernels", method="GET")).body)
        model.update(next((m for m in models if m["id"] == started), {"gone": True}))
        return model.get("execution_state") == "dead" or "gone" in model

    await server.wait_for(dead)
    assert "is not a lowercase UUID" in model.get("reason", ""), model
    # The REST API cannot name such an id; a server shutdown releases what the backend holds.
    await server.app.kernel_manager.shutdown_all()
    assert launcher_pids() == set()
    # No log, no checkpoint directory; nothing outside deleted.
    assert sorted(p.name for p in (tmp_path / "root").rglob("*")) == ["precious", "victim"]
    # The GPU is free: the next kernel starts and runs.
    good = await server.start(name)
    assert (await server.execute(good, "1 + 1"))["data"] == "2"
    await server.shutdown_and_wait(good)
