"""A Jupyter server's local backend on a machine with the system queue service: the service's
config, not the server's settings, says what there is; its per-user limits show in the reason."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_queue.machine import client
from tests.conftest import KernelspecFactory, Server
from tests.machine.system import Machine


@pytest.fixture
def system(monkeypatch: pytest.MonkeyPatch) -> Iterator[Machine]:
    root = Path(tempfile.mkdtemp(prefix="kq-sys-", dir="/tmp"))  # short: a socket path
    root.chmod(0o755)
    monkeypatch.setenv(client.SYSTEM_SOCKET_ENV, str(root / "run" / "queue.sock"))
    monkeypatch.delenv(client.SOCKET_ENV, raising=False)
    yield Machine(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def local_backend_config() -> dict[str, object]:
    """This server believes it has four GPUs and one queue; the system service says otherwise."""
    return {"gpus": ["0", "1", "2", "3"], "queues": ["mine"]}


async def test_the_system_services_quota_holds_and_its_limit_is_the_reason_a_kernel_waits(
    server: Server, kernelspec: KernelspecFactory, system: Machine
) -> None:
    async with system:
        await system.start(
            gpus=["5", "6"], queues=["gpu"], users={"*": {"max_gpus": 1}}, privacy="names"
        )
        two = await server.start(kernelspec("two", gpus=3))
        model = await server.wait_reason(two, "could never start")
        assert model["reason"].startswith("kernel ") and "asks for 3 GPU(s)" in model["reason"]
        assert "2 pretend GPU(s) in all" in model["reason"]
        assert "`gpus` in the machine's kernel-queue service config" in model["reason"]

        name = kernelspec("one", gpus=1)
        first = await server.start(name)
        visible = "import os; os.environ['CUDA_VISIBLE_DEVICES']"
        assert (await server.execute(first, visible))["data"] == "'5'"  # the service's GPU
        second = await server.start(name)
        model = await server.wait_reason(second, "already holds")
        assert model["reason"] == (
            "queued in 'gpu', position 1 of 1, needs 1 GPU; root already holds 1 of the 1 GPU "
            "allowed at once; it starts when one of root's kernels stops"
        )
        await server.shutdown(first)
        assert (await server.execute(second, visible))["data"] in ("'5'", "'6'")
        await server.shutdown_and_wait(second)
