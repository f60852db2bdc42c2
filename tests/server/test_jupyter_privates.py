"""The private parts of jupyter_server and jupyter_client that server/ and the provisioner read
(`kernel_queue/jupyter_privates.py`) are there, of the kind it expects, on a real server's
objects: a release that renames or retypes one fails here, naming it, instead of in a user's
server (a parked kernel that never answers kernel_info, a shutdown that never waits, a failed
launch logged twice)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from typing import Any

import pytest
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from jupyter_server.services.kernels.websocket import KernelWebsocketHandler

from kernel_queue import jupyter_privates
from kernel_queue.server.connection import QueuedWebsocketConnection
from kernel_queue.server.kernelmanager import QueuedMappingKernelManager
from tests.conftest import KernelspecFactory, Listener, Server

pytestmark = pytest.mark.local_gpus("0")


async def test_the_kernel_managers_privates_hold_its_kernels_starts_and_kernel_info(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    manager = server.app.kernel_manager
    assert isinstance(manager, QueuedMappingKernelManager)
    name = kernelspec(gpus=1)
    running = await server.start(name)
    assert (await server.execute(running, "1"))["data"] == "1"
    waiting = await server.start(name)
    await server.wait_reason(waiting, "position 1 of 1")

    kernels = jupyter_privates.kernels(manager)
    assert isinstance(kernels, dict), "MultiKernelManager._kernels"
    assert kernels.get(running) is manager.get_kernel(running), "MultiKernelManager._kernels"
    assert kernels.get(waiting) is manager.get_kernel(waiting), "MultiKernelManager._kernels"
    starts = jupyter_privates.pending(manager)
    assert isinstance(starts, dict), "MultiKernelManager._pending_kernels"
    start = starts.get(waiting)
    assert isinstance(start, asyncio.Future) and not start.done(), (
        "MultiKernelManager._pending_kernels: the waiting kernel's start"
    )

    # A start that ended, and one still waiting for its GPU.
    for kernel_id, ended in ((running, True), (waiting, False)):
        launch = jupyter_privates.start_future(manager.get_kernel(kernel_id))
        assert isinstance(launch, asyncio.Future | concurrent.futures.Future), (
            "KernelManager._ready"
        )
        assert launch.done() is ended, "KernelManager._ready: done once the launch has ended"

    # The websocket that ran the cell asked for kernel_info and left the reply on the kernel's
    # manager: what the server answers for the kernel once it is parked.
    info = jupyter_privates.stored_kernel_info(manager.get_kernel(running))
    assert isinstance(info, concurrent.futures.Future), "KernelManager._kernel_info_future"
    assert info.done() and info.result().get("protocol_version"), info
    assert jupyter_privates.stored_kernel_info(manager.get_kernel(waiting)) is None

    await server.shutdown_and_wait(waiting, running)


async def test_a_websocket_connections_privates_are_its_futures_and_the_session_registry(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    kernel_id = await server.start(kernelspec(gpus=1))
    assert (await server.execute(kernel_id, "1"))["data"] == "1"
    connection = QueuedWebsocketConnection(parent=server.app.kernel_manager.get_kernel(kernel_id))
    for name, future in (
        ("_kernel_info_future", jupyter_privates.own_kernel_info(connection)),
        ("_close_future", jupyter_privates.close_future(connection)),
    ):
        assert isinstance(future, concurrent.futures.Future), name
        assert not future.done(), name
    assert inspect.iscoroutinefunction(ZMQChannelsWebsocketConnection._register_session)

    sessions = jupyter_privates.open_sessions(connection)
    assert isinstance(sessions, dict), "_open_sessions"

    def mine() -> list[Any]:
        return [h for key, h in sessions.items() if key.startswith(f"{kernel_id}:")]

    listener = await Listener.open(server, kernel_id)
    try:
        handlers = mine()
        assert len(handlers) == 1, "_open_sessions: the open websocket, by its session_key"
        assert isinstance(handlers[0], KernelWebsocketHandler), handlers
    finally:
        listener.close()
    await server.wait_for(lambda: not mine(), what="the closed websocket's session unregistered")
    await server.shutdown_and_wait(kernel_id)


def test_the_private_methods_our_kernel_manager_overrides_are_jupyter_servers() -> None:
    for name in jupyter_privates.MANAGER_METHODS:
        theirs = getattr(AsyncMappingKernelManager, name, None)
        assert theirs is not None and inspect.iscoroutinefunction(theirs), (
            f"AsyncMappingKernelManager.{name} is gone: QueuedMappingKernelManager overrides it"
        )
        assert getattr(QueuedMappingKernelManager, name) is not theirs, name


def test_the_protocol_version_is_jupyter_clients() -> None:
    major, _, minor = jupyter_privates.PROTOCOL_VERSION.partition(".")
    assert major.isdigit() and minor.split(".")[0].isdigit(), jupyter_privates.PROTOCOL_VERSION
