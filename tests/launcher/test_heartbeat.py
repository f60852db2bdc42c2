"""The heartbeat probe against a real kernel launched by the launcher."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

from kernel_queue import heartbeat


def _ports() -> list[int]:
    sockets = [socket.socket() for _ in range(5)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


async def test_the_heartbeat_answers_while_a_kernel_runs_and_stops_when_it_goes() -> None:
    ports = _ports()
    hb = ports[4]
    assert not await heartbeat.beats("127.0.0.1", hb)  # nothing there yet
    env = {**os.environ, "KERNEL_QUEUE_LAUNCH_KEY": "k" * 32}
    launcher = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "kernel_queue.launcher", "--ports", ",".join(map(str, ports))],
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert await heartbeat.wait_for("127.0.0.1", hb, alive=True, within=60)
        launcher.send_signal(signal.SIGTERM)
        assert await heartbeat.wait_for("127.0.0.1", hb, alive=False, within=30)
    finally:
        if launcher.returncode is None:
            launcher.kill()
        await asyncio.wait_for(launcher.wait(), 30)
