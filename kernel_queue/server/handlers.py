"""REST: `GET /api/kernel-queue/kernels` lists the server's kernels with their queue state;
`POST …/kernels/<id>/park` and `…/resume` park a running kernel and wake a parked one;
`GET /api/kernel-queue/machine` lists the machine's whole local queue;
`GET /api/kernel-queue/queues` says each queue's capacity, use, holders and waiting list.

Authenticated and authorized like jupyter_server's own kernel API (resource "kernels"). Used by
`jupyter kernel-queue status` and by the JupyterLab extension when a page (re)loads and must
rebuild its view of the queue without the events it missed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from kernel_queue import backends, errors, jupyter_privates
from kernel_queue.backends.local import machine_link
from kernel_queue.server import kernels, parking, queues

KERNELS_PATH = "api/kernel-queue/kernels"
MACHINE_PATH = "api/kernel-queue/machine"
QUEUES_PATH = "api/kernel-queue/queues"
ACTION_ROUTE = r"(?P<kernel_id>[\w-]+)/(?P<action>park|resume)"
_BACKSTOP_SECONDS = 1.0  # at most between looks at whether a kernel shows its new state


class QueueStatusHandler(APIHandler):
    """Every kernel's Jupyter model, plus `queue` (the status-event payload) for queued ones
    and `waiting_since` (ISO 8601) for those waiting in a queue."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def get(self) -> None:
        manager = self.kernel_manager
        listing = [entry(manager, model) for model in manager.list_kernels()]
        self.finish(json.dumps(listing))


class MachineQueueHandler(APIHandler):
    """`GET /api/kernel-queue/machine`: the machine's whole local queue, every Jupyter server's
    and batch run's kernels of this user (`here` marks this server's), as the machine's queue
    service lists them; `service` null while this server has queued nothing locally."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def get(self) -> None:
        local = backends.existing("local", owner=self.kernel_manager)
        looks = getattr(local, "machine_queue", None)
        body = await looks() if callable(looks) else dict(machine_link.NOT_CONNECTED)
        self.finish(json.dumps(body))


class QueuesHandler(APIHandler):
    """`GET /api/kernel-queue/queues`: per queue its capacity and use, the kernels holding it
    (notebook, GPUs, idle since) and those waiting (`queues.listing` builds it)."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def get(self) -> None:
        body = await queues.listing(self.kernel_manager, self.session_manager)
        self.finish(json.dumps(body, default=str))


class ParkHandler(APIHandler):
    """`POST …/kernels/<id>/park`: 202 with the kernel's listing entry while it saves, 200 once
    parked, 409 with the sentence when it cannot be parked. `POST …/<id>/resume`: 202 while the
    kernel goes back to its queue, 200 (unchanged) when it was not parked. 404 for an unknown
    kernel. Parking and waking themselves are `parking.IdleParker`'s."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, action: str) -> None:
        manager = self.kernel_manager
        km = jupyter_privates.kernels(manager).get(kernel_id)
        parker = parking.parker_of(manager)
        if km is None:
            self._reply(404, {"message": f"no kernel {kernel_id} on this server"})
            return
        if parker is None:
            message = "this server's kernel manager does not park kernels (kernel-queue's does)"
            self._reply(409, {"message": message})
            return
        if action == "park":
            task = parker.park(kernel_id)
        elif parking.is_parked(km) or parker.busy_here(kernel_id):
            task = parker.wake(kernel_id)
        else:  # not parked: nothing to do
            self._reply(200, entry(manager, manager.kernel_model(kernel_id)))
            return
        # The answer comes once the kernel shows its new state (parked, or back in its queue),
        # or the action ended; the action goes on after it.
        wanted = action == "park"
        while not task.done() and parking.is_parked(km) != wanted:
            changed = asyncio.ensure_future(parking.changed(km))
            # A change told before `changed` began waiting is seen within the backstop.
            await asyncio.wait(
                {task, changed}, timeout=_BACKSTOP_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            changed.cancel()
        if task.done() and not task.cancelled() and task.exception() is not None:
            error = task.exception()
            if isinstance(error, errors.ParkRefused):
                self._reply(409, {"message": str(error)})
                return
            raise web.HTTPError(500, f"could not {action} kernel {kernel_id}: {error}")
        # Parked with its GPUs given back: done (200); still saving, or going back to its
        # queue: accepted, under way (202).
        session = kernels.session_of(km)
        still_parking = session is not None and session.parking
        status = 200 if wanted and not still_parking else 202
        self._reply(status, entry(manager, manager.kernel_model(kernel_id)))

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        self.set_status(status)
        self.finish(json.dumps(body, default=str))


def entry(manager: Any, model: dict[str, Any]) -> dict[str, Any]:
    """One kernel's listing entry: its Jupyter `model` plus `queue` and `waiting_since`."""
    km = manager.get_kernel(model["id"])
    session = kernels.session_of(km)
    since = session.waiting_since if session is not None else None
    return {**model, "queue": kernels.queue_status(km), "waiting_since": since}


def register(serverapp: Any) -> None:
    """Add the handlers under the server's base URL."""
    route = url_path_join(serverapp.base_url, KERNELS_PATH)
    action = url_path_join(route, ACTION_ROUTE)
    machine = url_path_join(serverapp.base_url, MACHINE_PATH)
    listing = url_path_join(serverapp.base_url, QUEUES_PATH)
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (route, QueueStatusHandler),
            (action, ParkHandler),
            (machine, MachineQueueHandler),
            (listing, QueuesHandler),
        ],
    )
