"""Ask a kernel's heartbeat channel whether a kernel process answers at an address.

Used where a backend cannot see kernel processes (a pod's launcher restarts its kernel in place
without the API server noticing): the provisioner waits for the old kernel to stop answering and
the new one to answer. ZeroMQ REQ/REP echo, as jupyter_client's own heartbeat; asyncio only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import zmq
import zmq.asyncio

# How long one ping waits for its echo. A live kernel answers in well under a millisecond; a
# kernel busy in C code still echoes (ipykernel's heartbeat runs on its own thread).
PING_TIMEOUT = 0.5
# The pause between pings while waiting for a change.
PING_INTERVAL = 0.2


async def beats(ip: str, port: int, *, within: float = PING_TIMEOUT) -> bool:
    """True if a kernel echoes a ping on tcp://ip:port within `within` seconds."""
    context = zmq.asyncio.Context.instance()
    socket = context.socket(zmq.REQ)
    socket.linger = 0
    try:
        socket.connect(f"tcp://{ip}:{port}")
        await socket.send(b"ping")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                return bool(await socket.recv())
        return False
    finally:
        socket.close(linger=0)


async def wait_for(ip: str, port: int, *, alive: bool, within: float) -> bool:
    """Wait until the heartbeat answers (`alive`) or stops answering; False if `within` passed."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        remaining = deadline - time.monotonic()
        if await beats(ip, port, within=min(PING_TIMEOUT, max(remaining, 0.01))) == alive:
            return True
        await asyncio.sleep(min(PING_INTERVAL, max(deadline - time.monotonic(), 0)))
    return False
