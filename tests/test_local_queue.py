"""End to end on the local backend: real jupyter_server, real launchers and ipykernel kernels."""

from __future__ import annotations

from tests.conftest import KernelspecFactory, Server, launcher_pids


async def test_third_gpu_kernel_waits_then_runs_when_a_gpu_frees(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    first, second = await server.start(name), await server.start(name)
    assert (await server.execute(first, "1+1"))["data"] == "2"
    assert (await server.execute(second, "2+2"))["data"] == "4"

    third = await server.start(name)
    model = await server.wait_reason(third, "position 1 of 1")
    assert model["reason"] == "queued in 'gpu', position 1 of 1, needs 1 GPU"
    assert model["execution_state"] == "starting"

    await server.shutdown(first)
    result = await server.execute(third, "1+1")
    assert result["data"] == "2"
    await server.shutdown_and_wait(second, third)
    assert launcher_pids() == set()
