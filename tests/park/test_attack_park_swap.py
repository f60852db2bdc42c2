"""A parked kernel's checkpoint directory swapped by someone else before the wake (another
kernel's checkpoints moved in, or a symlink planted in its place): the wake must not restore
what is not this kernel's, and the notebook is told."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from kernel_queue.server import kernels
from tests.conftest import KernelspecFactory, Server
from tests.local_parking import saving


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": ["0", "1"]}


async def _park_both(server: Server, name: str) -> tuple[str, str]:
    mine, theirs = await server.start(name), await server.start(name)
    assert (await server.execute(mine, "secret = 'mine'"))["status"] == "ok"
    assert (await server.execute(theirs, "secret = 'theirs'; planted = 1"))["status"] == "ok"
    for kernel in (mine, theirs):
        session = kernels.session_of(server.app.kernel_manager.get_kernel(kernel))
        assert session is not None
        await session.park()
        await server.wait_reason(kernel, "GPU released")
    return mine, theirs


async def test_another_kernels_checkpoints_moved_in_before_the_wake_are_refused_and_said(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path, store: Path
) -> None:
    mine, theirs = await _park_both(server, saving(kernelspec, store))
    shutil.move(store / mine, tmp_path / "aside")
    shutil.copytree(store / theirs, store / mine)

    back = await server.execute(mine, "'planted' in dir(), globals().get('secret')")
    assert back["data"] == "(False, None)", back  # never another kernel's variables
    assert "A checkpoint not written by this kernel was found and ignored" in back["stream"]
    theirs_back = await server.execute(theirs, "secret, planted")
    assert theirs_back["data"] == "('theirs', 1)", theirs_back
    await server.shutdown_and_wait(mine, theirs)


async def test_a_symlink_planted_for_its_checkpoints_is_never_followed_and_is_said(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path, store: Path
) -> None:
    """Followed, the wake renamed the other kernel's checkpoints aside as foreign (and would
    have written its own among them): the other kernel then woke with nothing."""
    mine, theirs = await _park_both(server, saving(kernelspec, store))
    shutil.move(store / mine, tmp_path / "aside")
    (store / mine).symlink_to(store / theirs)

    session = kernels.session_of(server.app.kernel_manager.get_kernel(mine))
    assert session is not None
    await session.resume()
    model = await server.wait_reason(mine, "symlink")
    assert (
        f"cannot resume: its checkpoint directory {store / mine} is a symlink to "
        f"{store / theirs}, which someone put in its place; this server never reads or writes "
        "checkpoints through a link: remove it and start the kernel again"
    ) in model["reason"], model["reason"]
    await server.shutdown_and_wait(mine)  # its release deletes nothing through the link
    assert not list((store / theirs).glob("*.foreign")), list((store / theirs).iterdir())
    theirs_back = await server.execute(theirs, "secret, planted")
    assert theirs_back["data"] == "('theirs', 1)", theirs_back
    await server.shutdown_and_wait(theirs)
