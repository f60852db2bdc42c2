"""`checkpoint.continuous: false` in a kernelspec reaches the kernel: no save follows a cell,
while the same kernelspec with the default saves after it (the two side by side)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": []}


def manifests(store: Path) -> list[Path]:
    return sorted(store.rglob("manifest.json"))


async def test_continuous_off_saves_nothing_after_a_cell_and_the_default_does(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    stores = {"off": tmp_path / "off", "on": tmp_path / "on"}
    kernels = {}
    for name, store in stores.items():
        checkpoint: dict[str, Any] = {"enabled": True, "path": str(store)}
        if name == "off":
            checkpoint["continuous"] = False
        kernels[name] = await server.start(kernelspec(name, queue="cpu", checkpoint=checkpoint))
    for kernel in kernels.values():
        assert (await server.execute(kernel, "x = 41"))["status"] == "ok"

    def saved_after_the_cell() -> bool:
        return bool(manifests(stores["on"]))

    await server.wait_for(saved_after_the_cell, within=60)
    # The "on" kernel's save came after its cell, which ran after the "off" kernel's.
    assert manifests(stores["off"]) == []
    await server.shutdown_and_wait(*kernels.values())
