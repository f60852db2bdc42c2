"""Idle time that passes at once: the idle-parking scan's clock in a test (`VirtualClock`, real
monotonic time plus what the test lets pass), given to a real server's parker (`on_virtual_time`),
and idle time passing for its kernels (`idle_time_passes`), for the tests where waiting for a
kernel to go idle is the point."""

from __future__ import annotations

import time

from kernel_queue.server import parking
from tests.conftest import Server


class VirtualClock:
    """Real monotonic time, and `ahead` seconds more that the test let pass at once."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead

    def advance(self, seconds: float) -> None:
        self.ahead += seconds


def parker(server: Server) -> parking.IdleParker:
    found = parking.parker_of(server.app.kernel_manager)
    assert found is not None, "the server's kernel manager does not park"
    return found


def on_virtual_time(server: Server) -> VirtualClock:
    """Give the server's parker a virtual clock (it reads the same time as before, until the test
    advances it)."""
    clock = VirtualClock()
    parker(server).clock = clock
    return clock


def idle_time_passes(server: Server, clock: VirtualClock, seconds: float) -> list[str]:
    """`seconds` pass at once for the server's kernels: the scan looks (placing each kernel's
    latest activity on the clock, as it does every interval), the clock moves on, the scan looks
    again. The kernels that second look started parking."""
    parker(server).scan()
    clock.advance(seconds)
    return parker(server).scan()
