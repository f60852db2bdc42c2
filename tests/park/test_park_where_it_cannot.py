"""`park_after` where nothing would park the kernel is refused at launch with a sentence, and
leaves nothing: a Jupyter server whose admin chose jupyter_server's own kernel manager (as
Kernel Gateway brings its own) has no idle scanner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server, launcher_pids


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    """The shipped config, with the admin's choice of jupyter_server's kernel manager."""
    manager = "jupyter_server.services.kernels.kernelmanager.AsyncMappingKernelManager"
    return {**jp_server_config, "ServerApp": {"kernel_manager_class": manager}}


async def test_park_after_without_a_kernel_manager_that_parks_is_refused(
    server: Server,
    kernelspec: KernelspecFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    checkpoint = {"enabled": True, "path": str(tmp_path / "checkpoints")}
    name = kernelspec(gpus=1, park_after=600, checkpoint=checkpoint)
    response = await server.fetch(
        "api", "kernels", method="POST", body=f'{{"name": "{name}"}}', raise_error=False
    )
    assert response.code == 500  # jupyter_server's own manager starts kernels synchronously
    logged = caplog.text
    assert (
        "`park_after` is 600 but this server does not park idle kernels (its kernel manager "
        "is AsyncMappingKernelManager); run Jupyter Server with the kernel_queue server "
        "extension, or set `park_after` to 0" in logged
    )
    assert launcher_pids() == set()
    assert await server.kernel_ids() == set()
