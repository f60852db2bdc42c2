"""The idle-parking scan's rules, case by case: what counts as idle, what never parks, how often
it looks. (The server tests, `test_park_idle.py`, run the same scan with real kernels; kernels in
every state at a chosen moment are only practical to build here.)"""

from __future__ import annotations

import concurrent.futures
import datetime
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from kernel_queue.server import parking
from kernel_queue.session import KernelSession
from tests.park.idle_time import VirtualClock


class Session(KernelSession):
    """A kernel's session in a chosen state: what the scan reads of one."""

    def __init__(
        self, state: str = "running", *, parked: bool = False, waiting: bool = False
    ) -> None:
        self.state, self.is_parked, self.is_waiting = state, parked, waiting
        self.tracker: Any = object()  # submitted (None: released)

    @property
    def parked(self) -> bool:
        return self.is_parked

    @property
    def waiting(self) -> bool:
        return self.is_waiting

    def queue_status(self) -> dict[str, Any]:
        return {"state": self.state}


@dataclass
class Provisioner:
    """A queued kernel's provisioner, as server/ sees one (`kernels.QueuedProvisioner`)."""

    kernel_session: Session = field(default_factory=Session)
    park_after: float = 2.0
    namespace: str | None = None
    refusal: dict[str, Any] | None = None

    async def cancel_launch(self) -> None:
        raise AssertionError("the scan never cancels a launch")


def released() -> Session:
    session = Session()
    session.tracker = None
    return session


def ready() -> concurrent.futures.Future[None]:
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    future.set_result(None)
    return future


@dataclass
class Kernel:
    provisioner: Provisioner = field(default_factory=Provisioner)
    execution_state: str = "idle"
    idle_seconds: float = 10.0
    ready: concurrent.futures.Future[None] = field(default_factory=ready)
    active: datetime.datetime | None = None
    """Its last IOPub message, fixed (None: always `idle_seconds` ago)."""

    @property
    def last_activity(self) -> datetime.datetime:
        if self.active is not None:
            return self.active
        return datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=self.idle_seconds)


class Manager:
    def __init__(self, **kernels: Kernel) -> None:
        self._kernels = kernels
        self.log = logging.getLogger("test")


def idle(kernel: Kernel) -> float | None:
    return parking.IdleParker(Manager(k=kernel)).idle_for("k")


def test_an_idle_running_kernel_past_its_park_after_is_due() -> None:
    seconds = idle(Kernel(idle_seconds=10))
    assert seconds is not None and 10 <= seconds < 11
    assert idle(Kernel(provisioner=Provisioner(Session("resumed")))) is not None
    # jupyter_server says "starting" until a status reaches it: never, if no client ever spoke
    # to the kernel. It runs (the provisioner says so) and nothing asked it to do anything.
    assert idle(Kernel(execution_state="starting")) is not None


@pytest.mark.parametrize(
    "kernel",
    [
        pytest.param(Kernel(idle_seconds=1), id="idle-less-than-park-after"),
        pytest.param(Kernel(execution_state="busy"), id="a-cell-runs"),
        pytest.param(Kernel(execution_state="restarting"), id="restarting"),
        pytest.param(Kernel(provisioner=Provisioner(park_after=0)), id="park-after-off"),
        pytest.param(Kernel(provisioner=Provisioner(Session(parked=True))), id="parked-already"),
        pytest.param(
            Kernel(provisioner=Provisioner(Session("requeued", waiting=True))), id="waiting"
        ),
        pytest.param(Kernel(provisioner=Provisioner(Session("admitted"))), id="starting"),
        pytest.param(Kernel(provisioner=Provisioner(released())), id="released"),
        pytest.param(Kernel(ready=concurrent.futures.Future()), id="launch-not-ended"),
    ],
)
def test_what_is_never_parked(kernel: Kernel) -> None:
    assert idle(kernel) is None


def test_a_client_message_starts_the_idle_time_again() -> None:
    parker = parking.IdleParker(Manager(k=Kernel(idle_seconds=10)))
    assert parker.idle_for("k") is not None
    parker.client_message("k")
    assert parker.idle_for("k") is None


def test_idle_time_passes_on_the_parkers_clock() -> None:
    """Its clock alone says how much time passed since the kernel's last IOPub message (placed
    on the clock when the scan first sees it) and since its last client message."""
    clock = VirtualClock()
    kernel = Kernel(active=datetime.datetime.now(datetime.UTC))  # park_after is 2 s
    parker = parking.IdleParker(Manager(k=kernel), clock=clock)
    assert parker.idle_for("k") is None
    clock.advance(2.0)
    seconds = parker.idle_for("k")
    assert seconds is not None and 2 <= seconds < 3
    kernel.active = datetime.datetime.now(datetime.UTC)  # an IOPub message: idle from now on
    assert parker.idle_for("k") is None
    clock.advance(2.0)
    assert parker.idle_for("k") is not None
    parker.client_message("k")
    assert parker.idle_for("k") is None
    clock.advance(1.0)
    assert parker.idle_for("k") is None
    clock.advance(1.0)
    assert parker.idle_for("k") is not None


def test_a_kernel_back_from_its_queue_gets_its_whole_park_after() -> None:
    kernel = Kernel(provisioner=Provisioner(Session("requeued", waiting=True)))
    parker = parking.IdleParker(Manager(k=kernel))
    assert parker.idle_for("k") is None  # seen waiting (its last activity is old)
    session = kernel.provisioner.kernel_session
    session.state, session.is_waiting = "resumed", False
    assert parker.idle_for("k") is None  # idle counts from when it was last seen waiting


@pytest.mark.parametrize(
    ("afters", "interval"),
    [([], 30.0), ([2.0], 1.0), ([0.0, 100.0], 10.0), ([120.0, 60.0], 6.0), ([3600.0], 30.0)],
)
def test_the_scan_looks_every_tenth_of_the_smallest_park_after_within_1_and_30_s(
    afters: list[float], interval: float
) -> None:
    kernels = {f"k{i}": Kernel(provisioner=Provisioner(park_after=a)) for i, a in enumerate(afters)}
    assert parking.IdleParker(Manager(**kernels)).interval() == interval


def test_a_parked_kernels_messages_are_held_and_kernel_info_answered_until_one_is_held() -> None:
    kernel = Kernel(provisioner=Provisioner(Session("parked", parked=True)))
    parker = parking.IdleParker(Manager(k=kernel))
    assert parker.holding("k") and parker.answers_for("k")
    sent: list[str] = []
    parker.hold("k", sent.append, "complete_request", wakes=False)
    assert parker.holding("k") and not parker.answers_for("k")  # replies keep their order
    parker.flush("k")
    assert sent == ["complete_request"]
    session = kernel.provisioner.kernel_session
    session.is_parked, session.state = False, "running"
    assert not parker.holding("k") and not parker.answers_for("k")
    assert not parker.holding("unknown")
