"""REST: `GET /api/kernel-queue/kernels` lists the server's kernels with their queue state.

Authenticated and authorized like jupyter_server's own kernel API (resource "kernels"). Used by
`jupyter kernel-queue status` and by the JupyterLab extension when a page (re)loads and must
rebuild its view of the queue without the events it missed. Status events do not carry when a
wait began, so a listener here remembers it for the listing's `waiting_since`.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from kernel_queue import events, lifecycle

KERNELS_PATH = "api/kernel-queue/kernels"
_CLOCK_SETTING = "kernel_queue_wait_clock"


class WaitClock:
    """When each kernel's current wait for (re-)admission began, learnt from status events."""

    def __init__(self) -> None:
        self._since: dict[str, datetime.datetime] = {}

    def observe(self, data: dict[str, Any], now: datetime.datetime | None = None) -> None:
        """Start the clock when a kernel begins waiting (queued, or preempted and requeued);
        stop it when the kernel leaves the queue."""
        kernel_id, state = str(data["kernel_id"]), data["state"]
        if state in lifecycle.WAITING:
            self._since.setdefault(kernel_id, now or datetime.datetime.now(datetime.UTC))
        else:
            self._since.pop(kernel_id, None)

    async def listener(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        """jupyter_events listener for the status schema (run as a task after each emit)."""
        self.observe(data)

    def since(self, kernel_id: str) -> str | None:
        """ISO 8601 start of the kernel's current wait, None when it does not wait."""
        began = self._since.get(kernel_id)
        return began.isoformat() if began is not None else None

    def retain(self, kernel_ids: set[str]) -> None:
        """Forget kernels the server no longer has (shut down while queued)."""
        for gone in self._since.keys() - kernel_ids:
            del self._since[gone]


class QueueStatusHandler(APIHandler):
    """Every kernel's Jupyter model, plus `queue` (the status-event payload) for queued ones
    and `waiting_since` for those waiting in a queue."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def get(self) -> None:
        manager = self.kernel_manager
        clock: WaitClock | None = self.settings.get(_CLOCK_SETTING)
        listing = []
        for model in manager.list_kernels():
            km = manager.get_kernel(model["id"])
            provisioner = getattr(km, "provisioner", None)
            state = getattr(provisioner, "queue_status", None)
            queue = state() if callable(state) else None
            waiting = queue is not None and queue["state"] in lifecycle.WAITING
            since = clock.since(model["id"]) if clock is not None and waiting else None
            listing.append({**model, "queue": queue, "waiting_since": since})
        if clock is not None:
            clock.retain({k["id"] for k in listing})
        self.finish(json.dumps(listing))


def register(serverapp: Any) -> None:
    """Add the handlers under the server's base URL, and the wait clock's event listener
    (after the schema is registered)."""
    clock = WaitClock()
    serverapp.event_logger.add_listener(schema_id=events.SCHEMA_ID, listener=clock.listener)
    serverapp.web_app.settings[_CLOCK_SETTING] = clock
    route = url_path_join(serverapp.base_url, KERNELS_PATH)
    serverapp.web_app.add_handlers(".*$", [(route, QueueStatusHandler)])
