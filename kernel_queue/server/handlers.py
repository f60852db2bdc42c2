"""REST: `GET /api/kernel-queue/kernels` lists the server's kernels with their queue state.

Authenticated and authorized like jupyter_server's own kernel API (resource "kernels"). Used by
`jupyter kernel-queue status` and by the JupyterLab extension when a page (re)loads and must
rebuild its view of the queue without the events it missed.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

KERNELS_PATH = "api/kernel-queue/kernels"


class QueueStatusHandler(APIHandler):
    """Every kernel's Jupyter model, plus `queue` (the status-event payload) for queued ones
    and `waiting_since` (ISO 8601) for those waiting in a queue."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def get(self) -> None:
        manager = self.kernel_manager
        listing = []
        for model in manager.list_kernels():
            km = manager.get_kernel(model["id"])
            provisioner = getattr(km, "provisioner", None)
            state = getattr(provisioner, "queue_status", None)
            since = getattr(provisioner, "waiting_since", None)
            queue = state() if callable(state) else None
            listing.append({**model, "queue": queue, "waiting_since": since})
        self.finish(json.dumps(listing))


def register(serverapp: Any) -> None:
    """Add the handlers under the server's base URL."""
    route = url_path_join(serverapp.base_url, KERNELS_PATH)
    serverapp.web_app.add_handlers(".*$", [(route, QueueStatusHandler)])
