"""Bad kernelspec config fails the kernel with a sentence naming the fix, and leaves nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server, launcher_pids


async def _failure(server: Server, name: str) -> dict[str, Any]:
    kernel_id = await server.start(name)

    async def dead() -> bool:
        return (await server.model(kernel_id))["execution_state"] == "dead"

    await server.wait_for(dead)
    assert launcher_pids() == set()
    return await server.model(kernel_id)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param({"gpus": -1}, "`gpus` is -1; ask for 0 or more GPUs", id="negative-gpus"),
        pytest.param(
            {"gpus": 3},
            "asks for 3 GPU(s) but this machine has 2 GPU(s) in all, so it could never start",
            id="more-gpus-than-the-machine",
        ),
        pytest.param(
            {"backend": "slurm"},
            "`backend` is 'slurm', which is not a backend; set it to one of 'local', 'kubernetes'",
            id="unknown-backend",
        ),
        pytest.param(
            {"queue": "nope"},
            "queue 'nope' does not exist on the local backend; known queues: default, gpu, cpu",
            id="unknown-queue",
        ),
        pytest.param(
            {"gpus": "1"},
            "kernelspec config key 'gpus' must be a whole number such as 1, not '1' (str)",
            id="gpus-as-a-string",
        ),
        pytest.param(
            {"priority_class": "urgent"},
            "priority class 'urgent' does not exist; known classes: high, low, normal",
            id="unknown-priority-class",
        ),
        pytest.param(
            {"memory": "lots"},
            "`memory` is not valid ('lots' is not a quantity",
            id="memory-not-a-quantity",
        ),
        pytest.param(
            {"checkpoint": {"grace": 10}},
            "`checkpoint` has unknown keys ['grace']",
            id="checkpoint-unknown-key",
        ),
    ],
)
async def test_bad_config_fails_the_kernel_with_a_clear_error(
    server: Server, kernelspec: KernelspecFactory, config: dict[str, Any], expected: str
) -> None:
    model = await _failure(server, kernelspec(**config))
    assert expected in model["reason"]


async def test_admission_timeout_ends_the_wait_and_frees_the_place(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    busy = kernelspec("busy", gpus=2)
    patient = kernelspec("impatient", gpus=1, admission_timeout=1)
    holder = await server.start(busy)
    assert (await server.execute(holder, "1"))["data"] == "1"
    launchers = launcher_pids()

    waiter = await server.start(patient)

    async def dead() -> bool:
        return (await server.model(waiter))["execution_state"] == "dead"

    await server.wait_for(dead)
    reason = (await server.model(waiter))["reason"]
    assert "without being admitted (admission_timeout)" in reason
    assert "raise `admission_timeout` in the kernelspec" in reason
    assert launcher_pids() == launchers
    backend = server.backend()
    assert [g.spec.kernelspec for g in backend._groups.values()] == ["busy"]
    await server.shutdown_and_wait(holder)
