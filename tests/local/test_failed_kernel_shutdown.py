"""A kernel that failed before it ran (more GPUs than exist) is shut down at once, alone or with
the server: nothing waits on a launch that never happened."""

from __future__ import annotations

import asyncio

from tests.conftest import KernelspecFactory, Server


async def never_starting(server: Server, kernelspec: KernelspecFactory) -> str:
    """A kernel asking for more GPUs than exist, once it has failed."""
    failed = await server.start(kernelspec("three", gpus=3))
    await server.wait_reason(failed, "could never start")
    return failed


async def test_a_server_with_a_failed_kernel_shuts_down_at_once(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    failed = await never_starting(server, kernelspec)
    async with asyncio.timeout(15):
        await server.app.kernel_manager.shutdown_all()
    assert failed not in await server.kernel_ids()


async def test_a_failed_kernel_a_notebook_is_connected_to_is_shut_down_with_the_server(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    failed = await never_starting(server, kernelspec)
    ws = await server.ws_fetch("api", "kernels", failed, "channels")  # told: dead
    try:
        async with asyncio.timeout(15):
            await server.app.kernel_manager.shutdown_all()
    finally:
        ws.close()
    assert failed not in await server.kernel_ids()


async def test_a_failed_kernel_is_shut_down_at_once(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    failed = await never_starting(server, kernelspec)

    async def gone() -> bool:
        return failed not in await server.kernel_ids()

    async with asyncio.timeout(15):
        await server.shutdown(failed)
        await server.wait_for(gone)
