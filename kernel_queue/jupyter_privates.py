"""The private parts of jupyter_server and jupyter_client that the front ends read (server/ and
the provisioner), in one place.

Read from jupyter_server 2.21.1 and jupyter_client 8.10.0 (pyproject.toml allows
jupyter_server>=2.14 and jupyter_client>=8.6). None of it is a public API, so
tests/server/test_jupyter_privates.py checks each name on a real server's objects and fails,
naming it, when a release changes one; fix it here, nowhere else. It imports nothing of ours,
so that both front ends may import it (they may not import each other).

Read through the functions below:
- `MultiKernelManager._kernels` (jupyter_client): kernel id -> its `KernelManager`, pending
  kernels included. The public `get_kernel` answers an unknown id with an HTTP 404 under
  jupyter_server, and the scan and the websocket look kernels up that may just have gone.
- `MultiKernelManager._pending_kernels` (jupyter_client): kernel id -> the task of a start or a
  shutdown in progress.
- `KernelManager._ready` (jupyter_client): the future of the kernel's start, made when a start
  begins and done once it has ended (with the launch's error, if it failed); None before. The
  public `ready` makes one when there is none, so a reader that must not, the provisioner telling
  whether a failure ends the launch, reads it here.
- `KernelManager._kernel_info_future` (set by jupyter_server's websocket connection): the first
  connection's `kernel_info` request, kept on the kernel's manager so that one is sent per
  kernel; absent before a connection asked, and again after it closed.
- `ZMQChannelsWebsocketConnection._kernel_info_future`, `_close_future`, `_open_sessions` and
  `_register_session()`: one connection's own kernel_info request, its end, the server's open
  sessions by `session_key`, and the check that replaces a stale connection of the same session.

- `jupyter_client._version.protocol_version`: the kernel protocol version jupyter_client speaks
  (the package re-exports it, but not for a type checker), told for a parked kernel that has
  not replied to kernel_info yet.

Overridden, not read (`kernelmanager.QueuedMappingKernelManager`; the test checks they exist,
so that an override that no longer overrides anything fails there, not in production):
`AsyncMappingKernelManager._async_shutdown_kernel`, `_async_shutdown_all` and
`_finish_kernel_start`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from jupyter_client._version import protocol_version

PROTOCOL_VERSION: str = protocol_version
"""The kernel protocol version jupyter_client speaks."""

MANAGER_METHODS = ("_async_shutdown_kernel", "_async_shutdown_all", "_finish_kernel_start")
"""The private methods of jupyter_server's `AsyncMappingKernelManager` our manager overrides."""


def kernels(manager: Any) -> dict[str, Any]:
    """The multi-kernel manager's kernel managers by kernel id (pending kernels included)."""
    found: dict[str, Any] = manager._kernels
    return found


def pending(manager: Any) -> dict[str, asyncio.Future[Any]]:
    """The multi-kernel manager's starts and shutdowns in progress, by kernel id."""
    found: dict[str, asyncio.Future[Any]] = manager._pending_kernels
    return found


def start_future(km: Any) -> asyncio.Future[Any] | concurrent.futures.Future[Any] | None:
    """The kernel manager's start, if one began (`KernelManager._ready`): done once the launch
    ended; None before a start, or for no kernel manager."""
    future: asyncio.Future[Any] | concurrent.futures.Future[Any] | None = getattr(
        km, "_ready", None
    )
    return future


def stored_kernel_info(km: Any) -> concurrent.futures.Future[Any] | None:
    """The kernel_info request a websocket connection stored on the kernel's manager, if any."""
    future: concurrent.futures.Future[Any] | None = getattr(km, "_kernel_info_future", None)
    return future


def own_kernel_info(connection: Any) -> concurrent.futures.Future[Any]:
    """A websocket connection's own kernel_info request (its reply, or `{}` once given up)."""
    future: concurrent.futures.Future[Any] = connection._kernel_info_future
    return future


def close_future(connection: Any) -> concurrent.futures.Future[Any]:
    """Resolved when the websocket connection has closed."""
    future: concurrent.futures.Future[Any] = connection._close_future
    return future


def open_sessions(connection: Any) -> dict[str, Any]:
    """The server's open websocket handlers by `session_key` (one registry for all)."""
    found: dict[str, Any] = connection._open_sessions
    return found


async def register_session(connection: Any) -> None:
    """Register the connection's session, closing a stale connection of the same session."""
    await connection._register_session()
