"""A local kernel that saves checkpoints, so it can be parked: its kernelspec, its session, and
the steps every park test takes (started with a cell run, parked until its GPU is released)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernel_queue.server import kernels
from kernel_queue.session import KernelSession
from tests.conftest import KernelspecFactory, Server


def saving(kernelspec: KernelspecFactory, store: Path, name: str = "saving", **extra: Any) -> str:
    """A kernelspec of one GPU whose kernels save their checkpoints under `store`."""
    checkpoint = {"enabled": True, "path": str(store), "grace_seconds": 60}
    return kernelspec(name, gpus=1, checkpoint=checkpoint, **extra)


def session_of(server: Server, kernel_id: str) -> KernelSession:
    found = kernels.session_of(server.app.kernel_manager.get_kernel(kernel_id))
    assert found is not None, f"kernel {kernel_id} has no session"
    return found


async def running(server: Server, name: str, code: str) -> str:
    """A kernel of `name` started, once `code` ran in it."""
    kernel = await server.start(name)
    assert (await server.execute(kernel, code))["status"] == "ok"
    return kernel


async def park(server: Server, kernel_id: str, **park: Any) -> dict[str, Any]:
    """Park the kernel through its session; its model once its GPU is released."""
    await session_of(server, kernel_id).park(**park)
    return await server.wait_reason(kernel_id, "GPU released")


def in_store(store: Path, pattern: str = "*") -> list[str]:
    """What the store holds that matches `pattern` (nothing when it was never made)."""
    return sorted(path.name for path in store.glob(pattern))
