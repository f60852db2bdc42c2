"""`QueuedWebsocketConnection`: jupyter_server's kernel websocket, aware of queued and parked
kernels.

A kernel that waits in its queue (its launch has not ended) gets its websocket at once:
jupyter_server would hold the upgrade open until admission, and a browser lets only one
websocket per host be CONNECTING (RFC 6455 §4.1), so every other notebook in the tab would hang.
The connection tells the client the kernel is `starting` (a status without parent, as
jupyter_server's own restarting/dead statuses) and holds the client's messages in order; once
the kernel runs it connects as jupyter_server does (kernel info, nudge) and sends them on, so a
cell typed while queued runs once after admission. A launch that fails (or is cancelled) sends
the status `dead` and closes the websocket: JupyterLab then shows the kernel dead.

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
import contextlib
import json
import uuid
import weakref
from typing import Any

from jupyter_client.jsonutil import json_default
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from tornado.websocket import WebSocketClosedError

from kernel_queue import jupyter_privates
from kernel_queue.server import kernels, parking

V1 = "v1.kernel.websocket.jupyter.org"
HELD_LIMIT = 1000
"""Client messages held per connection to a waiting kernel at most; more are dropped (logged)."""
QUEUED_PROVISIONER = "kernel-queue"
"""The provisioner name of queued kernelspecs (the entry point of `QueuedKernelProvisioner`)."""

_server_sessions: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
"""Kernel manager -> the session id of what the server says for its kernel (`_server_session`)."""


def _future(km: Any) -> asyncio.Future[Any]:
    """The kernel manager's `ready` as an asyncio future."""
    ready = km.ready
    return ready if isinstance(ready, asyncio.Future) else asyncio.wrap_future(ready)


def not_running_queued(km: Any) -> bool:
    """The kernel is a queued one whose launch has not ended (it waits in its queue, or is
    admitted and starting, or restarts) or failed: its websocket must not wait for it, nor fail
    the upgrade (jupyter_server answers a failed launch with a 500 the browser cannot read)."""
    ready = km.ready
    if ready.done() and not ready.cancelled() and ready.exception() is None:
        return False
    if km.provisioner is not None:
        return kernels.provisioner_of(km) is not None
    # Before its provisioner exists (the first moments of a start): what its kernelspec names.
    try:
        metadata = km.kernel_spec.metadata or {}
    except Exception:
        return False
    provisioner_name = metadata.get("kernel_provisioner", {}).get("provisioner_name")
    return bool(provisioner_name == QUEUED_PROVISIONER)


class QueuedWebsocketConnection(ZMQChannelsWebsocketConnection):
    """Connects at once to a waiting kernel and holds its messages until it runs; holds a
    parked kernel's messages until it is back and answers for it while it is parked."""

    _early: list[Any] | None = None  # client messages held until the waiting kernel runs
    _late: asyncio.Task[None] | None = None  # connects once the waiting kernel runs
    _joined = False  # the late connection has joined jupyter_server's (channels, counts)

    # -- a kernel that waits in its queue ------------------------------------------------------

    async def prepare(self) -> None:
        """Before the websocket upgrade: jupyter_server's, except that for a waiting (or failed)
        kernel the upgrade completes at once (the rest of the preparation runs once it runs)."""
        if not not_running_queued(self.kernel_manager):
            await super().prepare()
            return
        await jupyter_privates.register_session(self)
        self._early = []
        self.log.debug("kernel %s waits in its queue: connecting at once", self.kernel_id)

    def connect(self) -> asyncio.Future[None] | None:  # type: ignore[override]
        if self._early is None:
            return super().connect()
        self._tell_status("starting")
        self._late = asyncio.get_running_loop().create_task(self._connect_once_running())
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def _connect_once_running(self) -> None:
        """Wait for the launch; then prepare and connect as jupyter_server does and send the
        held messages on in order. A failed launch tells the client `dead` and closes."""
        km = self.kernel_manager
        ready = _future(km)
        await asyncio.wait({ready})  # its outcome is read below, never raised here
        failed = ready.cancelled() or ready.exception() is not None
        # A queued kernel's launch ends only once it answers: one not alive now has ended.
        if failed or not await km.is_alive():
            self.log.debug("kernel %s did not start: telling its client", self.kernel_id)
            self._early = None
            self._tell_status("dead")
            self.websocket_handler.close(1000, "the kernel did not start")
            return
        self.session.key = km.session.key
        info = self.request_kernel_info()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.kernel_info_timeout):
                await asyncio.shield(info)
        self._joined = True
        connected = super().connect()
        if connected is not None:
            await connected
        held, self._early = self._early or [], None
        for message in held:
            self.handle_incoming_message(message)

    def disconnect(self) -> None:  # type: ignore[override]
        late, self._late = self._late, None
        if late is not None and not late.done():
            late.cancel()
        if self._joined or late is None:
            super().disconnect()
            return
        # Never connected to the kernel: only the session registration is undone.
        self._early = None
        sessions = jupyter_privates.open_sessions(self)
        if sessions.get(self.session_key) is self.websocket_handler:
            sessions.pop(self.session_key)
        closed = jupyter_privates.close_future(self)
        if not closed.done():
            closed.set_result(None)

    def _parker(self) -> parking.IdleParker | None:
        return parking.parker_of(self.multi_kernel_manager)

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        if self._early is not None:
            if len(self._early) >= HELD_LIMIT:
                self.log.warning(
                    "kernel %s waits: dropped a client message (too many)", self.kernel_id
                )
            else:
                self._early.append(incoming_msg)
            return
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
        if parking.is_parked(km) and jupyter_privates.stored_kernel_info(km) is None:
            # Not stored on the kernel manager: the woken kernel is asked again.
            own = jupyter_privates.own_kernel_info(self)
            if not own.done():
                own.set_result({})
            return asyncio.wrap_future(own)
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
        future = jupyter_privates.stored_kernel_info(self.kernel_manager)
        if future is not None and future.done() and not future.cancelled():
            info = future.result()
            if isinstance(info, dict) and info.get("protocol_version"):
                return {"status": "ok", **info}
        language = self.kernel_manager.kernel_spec.language or ""
        return {
            "status": "ok",
            "protocol_version": jupyter_privates.PROTOCOL_VERSION,
            "implementation": "kernel-queue",
            "implementation_version": "",
            "language_info": {"name": language},
            "banner": "",
            "help_links": [],
        }

    def _server_session(self) -> str:
        """The session id of what the server says for a kernel that cannot (one per kernel)."""
        return _server_sessions.setdefault(self.kernel_manager, uuid.uuid4().hex)

    def _tell_status(self, state: str) -> None:
        """Send the client an IOPub status without parent (as jupyter_server's own)."""
        msg = self.session.msg("status", content={"execution_state": state})
        msg["header"]["session"] = self._server_session()
        with contextlib.suppress(WebSocketClosedError):
            self._send("iopub", msg)

    def _answer_kernel_info(self, request_header: dict[str, Any]) -> None:
        parent = {"header": request_header}
        session_id = self._server_session()
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
