"""A kernel is reported running, or resumed, only once it answers: not when its process is
spawned. The kernel here takes a second in its start-up code, after its ports are bound and
before it serves, and touches a file when that code is done."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import EventLog, KernelspecFactory, Server

pytestmark = pytest.mark.local_gpus("0")


def slow_kernelspec(kernel_dir: Path, marker: Path) -> str:
    startup = f"import pathlib, time; time.sleep(1.5); pathlib.Path({str(marker)!r}).touch()"
    argv = [sys.executable, "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"]
    config = {"backend": "local", "queue": "gpu", "gpus": 1, "priority_class": "low"}
    spec = {
        "argv": [*argv, f"--IPKernelApp.exec_lines={json.dumps([startup])}"],
        "display_name": "slow",
        "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "kernel-queue", "config": config}},
    }
    (kernel_dir / "slow").mkdir(parents=True, exist_ok=True)
    (kernel_dir / "slow" / "kernel.json").write_text(json.dumps(spec))
    return "slow"


async def test_running_and_resumed_are_reported_once_the_kernel_answers(
    server: Server,
    kernelspec: KernelspecFactory,
    event_log: EventLog,
    jp_kernel_dir: Path,
    tmp_path: Path,
) -> None:
    marker = tmp_path / "started-up"
    kernel_id = await server.start(slow_kernelspec(jp_kernel_dir, marker))

    async def reported(state: str, times: int = 1) -> bool:
        return event_log.states(kernel_id).count(state) >= times

    await server.wait_for(lambda: reported("running"))
    assert marker.exists(), "reported running before the kernel's start-up code ended"
    marker.unlink()

    high = await server.start(kernelspec("high", gpus=1, priority_class="high"))
    assert (await server.execute(high, "1"))["data"] == "1"
    await server.wait_reason(kernel_id, "requeued")
    await server.shutdown_and_wait(high)
    await server.wait_for(lambda: reported("resumed"))
    assert marker.exists(), "reported resumed before the kernel's start-up code ended"
    await server.shutdown_and_wait(kernel_id)
