"""server/ tells a queued kernel by its provisioner (`server/kernels.py`) and reads its state
from its `KernelSession`: the provisioner offers what `kernels.QueuedProvisioner` names (server/
may not import it), and a kernel of another provisioner has no session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from kernel_queue.provisioner import QueuedKernelProvisioner
from kernel_queue.server import kernels
from kernel_queue.session import KernelSession
from tests.conftest import KernelspecFactory, Server

pytestmark = pytest.mark.local_gpus("0")


class Kernel:
    """A kernel manager as jupyter_client's: its provisioner, None until its start makes it."""

    def __init__(self, provisioner: Any) -> None:
        self.provisioner = provisioner


def test_only_a_queued_kernels_provisioner_is_one_server_reads() -> None:
    queued = QueuedKernelProvisioner(kernel_id="k", kernel_spec=None)
    assert kernels.provisioner_of(Kernel(queued)) is queued
    assert kernels.session_of(Kernel(queued)) is None  # no launch yet: no session
    assert kernels.queue_status(Kernel(queued)) is None
    plain = LocalProvisioner(kernel_id="k", kernel_spec=None)
    assert kernels.provisioner_of(Kernel(plain)) is None
    assert kernels.session_of(Kernel(plain)) is None
    assert kernels.session_of(Kernel(None)) is None and kernels.park_after(Kernel(None)) == 0


def test_a_kernel_refused_before_its_provisioner_was_made_lists_its_refusal() -> None:
    kernel = Kernel(None)
    kernels.refused(kernel, {"state": "failed", "message": "bad gpus"})
    assert kernels.queue_status(kernel) == {"state": "failed", "message": "bad gpus"}


async def test_a_running_queued_kernels_session_is_read_through_its_kernel_manager(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    checkpoint = {"enabled": True, "path": str(tmp_path / "checkpoints")}
    kernel_id = await server.start(kernelspec(gpus=1, park_after=600, checkpoint=checkpoint))
    assert (await server.execute(kernel_id, "1"))["data"] == "1"
    km = server.app.kernel_manager.get_kernel(kernel_id)
    session = kernels.session_of(km)
    assert isinstance(session, KernelSession) and session is km.provisioner.kernel_session
    assert session.live and not session.waiting and not session.parked
    assert (kernels.queue_status(km) or {})["state"] == "running"
    assert kernels.park_after(km) == 600
    await server.shutdown_and_wait(kernel_id)
