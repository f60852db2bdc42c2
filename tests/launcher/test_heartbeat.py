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


ECHO = """
import sys, zmq
socket = zmq.Context.instance().socket(zmq.REP)
socket.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
print("bound", flush=True)
while True:
    socket.send(socket.recv())
"""


async def _echo(port: int) -> asyncio.subprocess.Process:
    """A heartbeat of its own on `port` (ZeroMQ REP echo), once bound."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ECHO, str(port), stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    assert await asyncio.wait_for(process.stdout.readline(), 30) == b"bound\n"
    return process


async def test_the_end_of_a_kernel_is_seen_though_the_next_binds_its_port_at_once() -> None:
    # A pod's launcher restarts its kernel in place: the next one binds the same heartbeat port
    # moments after the first ended, and a ping sent into the gap is answered by it (ZeroMQ
    # reconnects every 100 ms). The end is seen on a connection to the kernel that was there.
    hb = _ports()[4]
    first = await _echo(hb)
    second = None
    try:
        assert await heartbeat.beats("127.0.0.1", hb)
        watching = asyncio.ensure_future(
            heartbeat.wait_for("127.0.0.1", hb, alive=False, within=20)
        )
        await asyncio.sleep(0.3)
        assert not watching.done()  # the first still serves
        first.kill()
        await first.wait()
        second = await _echo(hb)
        assert await asyncio.wait_for(watching, 10)
        assert await heartbeat.beats("127.0.0.1", hb)  # the next one answers
    finally:
        for process in (first, second):
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()


async def test_a_kernel_that_stays_is_not_gone_and_nothing_listening_is() -> None:
    hb = _ports()[4]
    assert await heartbeat.gone("127.0.0.1", hb, within=2)  # refused: nothing there
    kernel = await _echo(hb)
    try:
        assert not await heartbeat.gone("127.0.0.1", hb, within=0.5)
    finally:
        kernel.kill()
        await kernel.wait()
