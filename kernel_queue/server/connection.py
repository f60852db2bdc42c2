"""`QueuedWebsocketConnection`: jupyter_server's kernel websocket, aware of parked kernels.

Every client message counts as activity for idle parking (`parking.IdleParker`). While a kernel
is parked its messages are held, and the first `execute_request` wakes it. A parked kernel has
no process to answer, so the server answers for it what a client needs to go on:

- connecting: jupyter_server's `nudge` sends kernel_info requests until the kernel replies and
  IOPub delivers, for up to `kernel_info_timeout` (60 s), and the websocket reads no client
  message meanwhile. Connecting must not wake the kernel (JupyterLab reconnects on every network
  blip and page load; the GPU would come back for nothing), so for a parked kernel the nudge
  ends at once, as jupyter_server already does for a busy kernel, and a first connection with
  no kernel info cached gets the current protocol version;
- `kernel_info_request`: JupyterLab sends one on every (re)connection and holds the user's
  cells until it is answered (or a timeout), so the server replies with the kernel's last
  kernel info and an `idle` status (a parked kernel takes cells: the next one wakes it). The
  woken kernel's replies come from the kernel itself.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from jupyter_client._version import protocol_version
from jupyter_client.jsonutil import json_default
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

from kernel_queue.server import parking

V1 = "v1.kernel.websocket.jupyter.org"


class QueuedWebsocketConnection(ZMQChannelsWebsocketConnection):
    """Holds a parked kernel's messages until it is back; answers for it while it is parked."""

    def _parker(self) -> parking.IdleParker | None:
        parker = getattr(self.multi_kernel_manager, "parker", None)
        return parker if isinstance(parker, parking.IdleParker) else None

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        parker = self._parker()
        if parker is None or not self.channels:
            super().handle_incoming_message(incoming_msg)
            return
        kernel_id = self.kernel_id
        parker.client_message(kernel_id)
        if not parker.holding(kernel_id):
            super().handle_incoming_message(incoming_msg)
            return
        channel, header = self._peek(incoming_msg)
        msg_type = header.get("msg_type")
        allowed = self.multi_kernel_manager.allowed_message_types
        if allowed and msg_type not in allowed:  # jupyter_server drops (and logs) it
            super().handle_incoming_message(incoming_msg)
            return
        info = channel == "shell" and msg_type == "kernel_info_request"
        if info and parker.answers_for(kernel_id):
            self._answer_kernel_info(header)
            return
        parker.hold(kernel_id, self._forward, incoming_msg, wakes=msg_type == "execute_request")

    def _forward(self, incoming_msg: Any) -> None:
        """Send a held message on, as jupyter_server sends any (dropped once disconnected)."""
        super().handle_incoming_message(incoming_msg)

    def nudge(self) -> asyncio.Future[None]:
        km = self.kernel_manager
        if parking.is_parked(km):
            self.log.debug("kernel %s is parked: not nudging it", self.kernel_id)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return super().nudge()

    def request_kernel_info(self) -> Any:
        km = self.kernel_manager
        if parking.is_parked(km) and getattr(km, "_kernel_info_future", None) is None:
            # Not stored on the kernel manager: the woken kernel is asked again.
            if not self._kernel_info_future.done():
                self._kernel_info_future.set_result({})
            return asyncio.wrap_future(self._kernel_info_future)
        return super().request_kernel_info()

    # -- answering for a parked kernel -------------------------------------------------------

    def _peek(self, incoming_msg: Any) -> tuple[str, dict[str, Any]]:
        """The channel and header of a client message, in either websocket protocol."""
        if self.subprotocol == V1:
            channel, parts = deserialize_msg_from_ws_v1(incoming_msg)
            header = self.session.unpack(parts[0]) if parts else {}
        else:
            if isinstance(incoming_msg, bytes):
                msg = deserialize_binary_message(incoming_msg)
            else:
                msg = json.loads(incoming_msg)
            channel, header = msg.get("channel"), msg.get("header")
        return str(channel or "shell"), header if isinstance(header, dict) else {}

    def _kernel_info(self) -> dict[str, Any]:
        """The kernel's last kernel_info reply content, else what the kernelspec says."""
        future = getattr(self.kernel_manager, "_kernel_info_future", None)
        if future is not None and future.done() and not future.cancelled():
            info = future.result()
            if isinstance(info, dict) and info.get("protocol_version"):
                return {"status": "ok", **info}
        spec = getattr(self.kernel_manager, "kernel_spec", None)
        language = getattr(spec, "language", "") or ""
        return {
            "status": "ok",
            "protocol_version": protocol_version,
            "implementation": "kernel-queue",
            "implementation_version": "",
            "language_info": {"name": language},
            "banner": "",
            "help_links": [],
        }

    def _answer_kernel_info(self, request_header: dict[str, Any]) -> None:
        parent = {"header": request_header}
        session_id = getattr(self.kernel_manager, "_kernel_queue_parked_session", None)
        if session_id is None:
            session_id = uuid.uuid4().hex
            self.kernel_manager._kernel_queue_parked_session = session_id
        # The status goes without a parent, as jupyter_server's own restarting/dead statuses do:
        # JupyterLab ignores statuses whose parent is a kernel_info_request
        # (`untracked_message_types`), and would show the kernel as Unknown.
        for channel, msg_type, content, parent_msg in (
            ("shell", "kernel_info_reply", self._kernel_info(), parent),
            ("iopub", "status", {"execution_state": "idle"}, None),
        ):
            msg = self.session.msg(msg_type, content=content, parent=parent_msg)
            msg["header"]["session"] = session_id
            self._send(channel, msg)

    def _send(self, channel: str, msg: dict[str, Any]) -> None:
        if self.subprotocol == V1:
            self.write_message(serialize_msg_to_ws_v1(msg, channel, self.session.pack), binary=True)
        else:
            self.write_message(
                json.dumps({**msg, "channel": channel, "buffers": []}, default=json_default)
            )
