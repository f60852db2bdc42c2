"""Ten preemptions of one kernel on the local backend lose nothing (tests/cycle_torture.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import KernelspecFactory, Server
from tests.cycle_torture import torture

pytestmark = [pytest.mark.timeout(600), pytest.mark.local_gpus("0")]


async def test_ten_preemptions_lose_no_value_and_report_every_name(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    checkpoint = {"enabled": True, "path": str(tmp_path / "checkpoints"), "grace_seconds": 30}
    low = await server.start(kernelspec("low", gpus=1, priority_class="low", checkpoint=checkpoint))
    high_name = kernelspec("high", gpus=1, priority_class="high")

    async def preempt(kernel_id: str) -> str:
        high = await server.start_running(high_name)
        model = await server.wait_reason(kernel_id, "requeued")
        await server.shutdown_and_wait(high)
        return str(model["reason"])

    await torture(server, low, preempt, cycles=10)
    await server.shutdown_and_wait(low)
