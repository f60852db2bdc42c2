"""Ports for the servers and kernels a test starts: free when drawn, and below the range Linux
hands out to outgoing connections (`net.ipv4.ip_local_port_range`, 32768-60999 by default), so
no other process's connection can take one between the draw and the bind. Ports drawn by binding
port 0 came from that range, and in a whole-suite run a restored kernel found its port taken
('Address already in use'). Each pytest-xdist worker draws from a block of its own, so two
workers never draw the same port; within a block the draws go round, so a test does not get the
port the previous one just closed."""

from __future__ import annotations

import os
import random
import socket

from kernel_queue_fake_cluster.control_plane.ports import bindable, ephemeral_lowest

LOWEST = 10_000
BLOCK = 2_500
"""Ports per worker: 8 workers' blocks lie within 10000-29999."""
_cursor: int | None = None


def _block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % 8 if worker.isdigit() else 0
    start = LOWEST + index * BLOCK
    return range(start, min(start + BLOCK, ephemeral_lowest()))


def free_ports(count: int = 5) -> list[int]:
    """`count` loopback ports of this worker's block that are free now."""
    global _cursor
    block = _block()
    if not block:  # the machine hands out every port to connections: take what bind(0) gives
        probes = [socket.socket() for _ in range(count)]
        try:
            for probe in probes:
                probe.bind(("127.0.0.1", 0))
            return [probe.getsockname()[1] for probe in probes]
        finally:
            for probe in probes:
                probe.close()
    if _cursor is None:
        _cursor = random.randrange(len(block))
    found: list[int] = []
    for _ in range(len(block)):
        port = block[_cursor % len(block)]
        _cursor += 1
        if bindable(port):
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError(f"no {count} free ports in {block}")


def free_port() -> int:
    """One loopback port of this worker's block that is free now."""
    return free_ports(1)[0]
