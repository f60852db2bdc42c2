"""Listening ports for the real control plane's processes (etcd, kube-apiserver, the
controllers, Kueue, the node agent).

A port is free when drawn, and lies below the range Linux hands out to outgoing connections
(`net.ipv4.ip_local_port_range`, 32768-60999 by default), so that no connection of any process
can take it between the draw and the process's own bind, seconds later. Ports from bind(0) come
from that range: a plane's kube-apiserver once found its port taken ('bind: address already in
use') beside kernels whose clients reconnected every 10 ms. The ports from `LOWEST` up to that
range are cut into `BLOCKS` blocks; a pytest-xdist worker draws from its own (other processes
from the block of their pid), so two workers starting planes at once never draw the same port,
and within a block the draws go round from a random start. (The suite's kernels and servers
draw from 10000-29999, tests/ports.py.)
"""

from __future__ import annotations

import os
import random
import socket

LOWEST = 30_000
BLOCKS = 8
_cursor: dict[int, int] = {}


def ephemeral_lowest() -> int:
    """The lowest port Linux gives an outgoing connection."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def block() -> range:
    """This process's block of ports (empty where the machine leaves none below its range)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
    index = int(worker) % BLOCKS if worker.isdigit() else os.getpid() % BLOCKS
    top = ephemeral_lowest()
    size = max(0, top - LOWEST) // BLOCKS
    start = LOWEST + index * size
    return range(start, start + size)


def draw() -> int:
    """A loopback port that is free now, from this process's block (or bind(0)'s, where the
    machine leaves no room below its outgoing range)."""
    ports = block()
    if len(ports) < 16:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])
    at = _cursor.get(ports.start)
    if at is None:
        at = random.randrange(len(ports))
    for step in range(len(ports)):
        port = ports[(at + step) % len(ports)]
        if bindable(port):
            _cursor[ports.start] = (at + step + 1) % len(ports)
            return port
    raise OSError(f"no free loopback port in {ports.start}-{ports.stop - 1}")


def bindable(port: int) -> bool:
    """Whether a loopback listener could bind `port` now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
