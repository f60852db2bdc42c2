"""Asking a kernel for kernel_info on its control channel (`kernel_info.answers`), against a
port that does not serve a kernel yet, as a kernel just spawned does not."""

from __future__ import annotations

import asyncio
import contextlib

from kernel_queue import kernel_info
from kernel_queue.model import ConnectionInfo


async def test_a_kernel_not_listening_yet_is_tried_again_every_few_milliseconds() -> None:
    """ZeroMQ's default retry, every 100 ms, made a kernel's start about 50 ms longer on average
    than its bind. Here a port that takes each connection and drops it at once (as a refused
    one ends) counts the tries in one second: about 10 with ZeroMQ's default, far more now."""
    tries = 0

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal tries
        tries += 1
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    connection = ConnectionInfo("127.0.0.1", 1, 2, 3, port, 5, key="secret")
    asking = asyncio.create_task(kernel_info.answers(connection, "127.0.0.1"))
    try:
        await asyncio.sleep(1.0)
    finally:
        asking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asking
        server.close()
        await server.wait_closed()
    assert tries > 20, f"{tries} tries in 1 s"  # 7 with the default, 67 here when quiet
