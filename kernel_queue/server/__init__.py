"""The jupyter_server extension: status events, the queue listing, cooperative cancel.

At link time (before the server builds its kernel manager) it selects
`QueuedMappingKernelManager` unless the server runs in gateway mode or the admin chose another
class; at load time it registers the status-event schema (early, so subscribers see it) and the
REST handler. Enabled by `etc/jupyter/jupyter_server_config.d/kernel_queue.json`.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.gateway.gateway_client import GatewayClient

from kernel_queue import events
from kernel_queue.server import handlers
from kernel_queue.server.connection import QueuedWebsocketConnection
from kernel_queue.server.kernelmanager import QueuedMappingKernelManager


def _link_jupyter_server_extension(serverapp: Any) -> None:
    """Before the server builds its kernel manager: choose ours, with pending kernels on, and
    our kernel websocket (it holds a parked kernel's messages and wakes it on a cell).

    Jupyter reads only `jpserver_extensions` from `jupyter_server_config.d/*.json`, so the
    kernel-manager settings are made here rather than in that file. An admin's explicit
    `kernel_manager_class`, `kernel_websocket_connection_class` or `use_pending_kernels`, and
    gateway mode, are left alone.
    """
    # Linking precedes the server's own `gateway_config`; the singleton it will use is this one.
    gateway = GatewayClient.instance(parent=serverapp)
    config = serverapp.config
    if gateway.gateway_enabled or "kernel_manager_class" in config.get("ServerApp", {}):
        serverapp.log.info(
            "kernel-queue: keeping kernel manager %s; cancelling a queued kernel waits for its "
            "admission unless it derives from %s",
            serverapp.kernel_manager_class,
            QueuedMappingKernelManager.__name__,
        )
        return
    serverapp.kernel_manager_class = QueuedMappingKernelManager
    if "kernel_websocket_connection_class" not in config.get("ServerApp", {}):
        serverapp.kernel_websocket_connection_class = QueuedWebsocketConnection
    else:
        serverapp.log.warning(
            "kernel-queue: keeping kernel websocket %s; parked kernels wake only on a REST "
            "resume unless it derives from %s",
            serverapp.kernel_websocket_connection_class,
            QueuedWebsocketConnection.__name__,
        )
    sections = ("MultiKernelManager", "AsyncMultiKernelManager", "MappingKernelManager")
    chosen = [
        s
        for s in (*sections, "AsyncMappingKernelManager", QueuedMappingKernelManager.__name__)
        if "use_pending_kernels" in config.get(s, {})
    ]
    if not chosen:
        config[QueuedMappingKernelManager.__name__]["use_pending_kernels"] = True


def _load_jupyter_server_extension(serverapp: Any) -> None:
    serverapp.event_logger.register_event_schema(events.SCHEMA_PATH)
    handlers.register(serverapp)
    serverapp.log.info("kernel-queue extension loaded (status events: %s)", events.SCHEMA_ID)
