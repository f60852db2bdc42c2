"""End to end on the local backend: real jupyter_server, real launchers and ipykernel kernels."""

from __future__ import annotations

import json

from tests.conftest import KernelspecFactory, Server, launcher_pids


async def test_third_gpu_kernel_waits_then_runs_when_a_gpu_frees(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    name = kernelspec(gpus=1)
    first, second = await server.start(name), await server.start(name)
    assert (await server.execute(first, "1+1"))["data"] == "2"
    assert (await server.execute(second, "2+2"))["data"] == "4"
    visible = "import os; os.environ['CUDA_VISIBLE_DEVICES']"
    gpus = {(await server.execute(k, visible))["data"] for k in (first, second)}
    assert gpus == {"'0'", "'1'"}  # each kernel sees only the GPU it was given
    # ... numbered as the driver (NVML, nvidia-smi) numbers them: by PCI bus, not CUDA's
    # fastest-first, so on a box of mixed GPUs index 1 is the card NVML calls 1
    order = "import os; os.environ.get('CUDA_DEVICE_ORDER')"
    assert (await server.execute(first, order))["data"] == "'PCI_BUS_ID'"

    third = await server.start(name)
    model = await server.wait_reason(third, "position 1 of 1")
    assert model["reason"] == "queued in 'gpu', position 1 of 1, needs 1 GPU"
    assert model["execution_state"] == "starting"

    await server.shutdown(first)
    result = await server.execute(third, "1+1")
    assert result["data"] == "2"
    freed = (await server.execute(third, visible))["data"]
    assert freed in gpus
    await server.shutdown_and_wait(second, third)
    assert launcher_pids() == set()


async def test_a_kernel_without_gpus_sees_none_and_does_not_wait_for_them(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    gpu = kernelspec("gpu", gpus=2)
    cpu = kernelspec("cpu", gpus=0, queue="cpu", cpu="1")
    holder = await server.start_running(gpu)
    plain = await server.start(cpu)
    result = await server.execute(plain, "import os; os.environ['CUDA_VISIBLE_DEVICES']")
    assert result["data"] == "''"
    await server.shutdown_and_wait(plain, holder)


async def test_provisioner_info_lets_a_new_provisioner_reattach_and_poll(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    from kernel_queue.provisioner import QueuedKernelProvisioner

    kernel = await server.start_running(kernelspec(gpus=1))
    km = server.app.kernel_manager.get_kernel(kernel)
    info = await km.provisioner.get_provisioner_info()
    assert info["group"]["kernel_id"] == kernel
    assert info["group"]["connection"]["shell_port"] == km.shell_port
    json.dumps(info)  # persisted by gateways as JSON

    def fresh() -> QueuedKernelProvisioner:
        return QueuedKernelProvisioner(kernel_id=kernel, kernel_spec=km.kernel_spec, parent=km)

    reattached = fresh()
    await reattached.load_provisioner_info(info)
    assert await reattached.poll() is None  # the group runs: alive
    await server.shutdown_and_wait(kernel)

    gone = fresh()
    await gone.load_provisioner_info(info)
    assert await gone.poll() == 0  # the group is gone: reported dead, not alive forever
    await reattached.cleanup()
