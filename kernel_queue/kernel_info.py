"""Ask a kernel for `kernel_info` on its control channel: does a kernel serve at an address?

The tracker reports a kernel running (or resumed) only once it answers, not when its process is
spawned or its port is bound. Control, not shell: a cell a client queued while the kernel was
away may run for long before a shell request would be answered. ZeroMQ DEALER, messages signed
with the kernel's key (jupyter_client's Session); asyncio only, nothing blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from kernel_queue.model import ConnectionInfo

RESEND = 1.0
"""Seconds between requests: one may be lost to a kernel that died before it answered."""
RECONNECT_MS = 10
"""Milliseconds between ZeroMQ's tries to connect to a kernel that does not listen yet (a kernel
just spawned binds its ports some 200 ms later). ZeroMQ's default, 100 ms, made a kernel's
start about 50 ms longer on average than its bind; a refused connect on this machine or in
the cluster costs the ZeroMQ I/O thread some microseconds."""


async def answers(connection: ConnectionInfo, address: str) -> None:
    """Return once a kernel at `address` answers a kernel_info_request; runs until cancelled."""
    session = Session(key=connection.key.encode(), signature_scheme=connection.signature_scheme)
    socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    socket.linger = 0
    socket.reconnect_ivl = RECONNECT_MS
    try:
        socket.connect(f"{connection.transport}://{address}:{connection.control_port}")
        while True:
            request = session.msg("kernel_info_request", {})
            session.send(socket, request)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RESEND):
                    while True:
                        frames = await socket.recv_multipart()
                        with contextlib.suppress(Exception):  # not a reply we can read
                            _, parts = session.feed_identities(frames)
                            reply = session.deserialize(parts, content=False)
                            if reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
                                return
    finally:
        socket.close(linger=0)
