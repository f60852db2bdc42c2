"""Ask a kernel's heartbeat channel whether a kernel process answers at an address.

Used where a backend cannot see kernel processes (a pod's launcher restarts its kernel in place
without the API server noticing): the provisioner waits for the old kernel's end (`gone`: a TCP
connection to it closes) and for the new one to answer (ZeroMQ REQ/REP echo, as jupyter_client's
own heartbeat). asyncio only.
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
    """Wait until the heartbeat answers (`alive`) or the kernel answering now is gone (`gone`);
    False if `within` passed."""
    if not alive:
        return await gone(ip, port, within=within)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        remaining = deadline - time.monotonic()
        if await beats(ip, port, within=min(PING_TIMEOUT, max(remaining, 0.01))) == alive:
            return True
        await asyncio.sleep(min(PING_INTERVAL, max(deadline - time.monotonic(), 0)))
    return False


async def gone(ip: str, port: int, *, within: float) -> bool:
    """Wait until the kernel process serving ip:port now has ended: a TCP connection opened to
    it closes when the process does (refused: nothing listens there). Pings cannot tell: a ZeroMQ
    client reconnects while a pod's launcher restarts its kernel, and a ping sent into the gap is
    answered by the next kernel once it binds (through kube-proxy, a refused connection reaches
    the client at once). The kernel's ZeroMQ socket sends its greeting and waits for ours, which
    never comes, so the connection stays open while the process lives (ZeroMQ gives up on a
    handshake after 30 s; a restart's wait is shorter). False if it is still open after
    `within` seconds."""
    deadline = time.monotonic() + within
    try:
        async with asyncio.timeout(within):
            reader, writer = await asyncio.open_connection(ip, port)
    except TimeoutError:
        return False
    except OSError:
        return True
    try:
        async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
            while await reader.read(4096):
                pass  # a greeting of its own; the end is what counts
        return True
    except TimeoutError:
        return False
    except OSError:  # reset as the process ended
        return True
    finally:
        writer.close()
