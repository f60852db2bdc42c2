"""The real control plane's listening ports (`control_plane.ports`): drawn below the range
Linux gives outgoing connections, from a block of the drawing pytest-xdist worker's own."""

from __future__ import annotations

import socket

import pytest

from kernel_queue_fake_cluster.control_plane import ports


def test_a_plane_port_is_free_and_below_the_range_of_outgoing_connections() -> None:
    drawn = [ports.draw() for _ in range(20)]
    assert all(ports.LOWEST <= port < ports.ephemeral_lowest() for port in drawn)
    assert len(set(drawn)) == 20  # the draws go round the block
    for port in drawn:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_each_worker_draws_from_a_block_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = []
    for worker in range(ports.BLOCKS):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        blocks.append(set(ports.block()))
        assert ports.draw() in blocks[-1]
    assert all(len(block) >= 300 for block in blocks)
    assert sum(len(block) for block in blocks) == len(set().union(*blocks))


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    first = ports.draw()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first + 1 if first + 1 in ports.block() else first))
        taken = holder.getsockname()[1]
        for _ in range(len(ports.block())):
            assert ports.draw() != taken
