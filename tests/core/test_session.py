"""A kernel's session, and the provisioner over it, on the scripted `FakeBackend`: no process,
no cluster. What the user is told, `poll`'s answers, a restart in place, releases, leases."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpec
from traitlets import Any as AnyTrait
from traitlets import Unicode
from traitlets.config import Configurable, LoggingConfigurable

from kernel_queue import backends, errors, session
from kernel_queue.backends.fake import FakeBackend
from kernel_queue.lifecycle import KernelState
from kernel_queue.model import ConnectionInfo, GroupSpec, Noted, StopCause
from kernel_queue.provisioner import QueuedKernelProvisioner
from tests import polling

KERNEL = "0b9f7a52-3d1c-4e8a-9f2b-6c1d2e3f4a5b"
S = KernelState


class Owner(Configurable):
    """What shares backends (a server's multi-kernel manager)."""


def group_spec(kernel_id: str = KERNEL, grace: float = 30.0) -> GroupSpec:
    connection = ConnectionInfo("127.0.0.1", 0, 0, 0, 0, 0, key="secret")
    return GroupSpec(
        kernel_id=kernel_id,
        queue="gpu",
        argv=("python",),
        connection=connection,
        gpus=1,
        grace_seconds=grace,
    )


class Told:
    """What a session told its front end."""

    def __init__(self) -> None:
        self.sentences: list[tuple[KernelState, str]] = []
        self.touches = 0

    def tell(self, state: KernelState, message: str) -> None:
        self.sentences.append((state, message))

    def touch(self) -> None:
        self.touches += 1


def new_session(fake: FakeBackend, *, counted: bool = False) -> tuple[session.KernelSession, Told]:
    owner = Owner()
    fake.serve(owner)
    lease = backends.BackendLease(fake.name, owner=owner, config=None, log=None, counted=counted)
    told = Told()
    kernel = session.KernelSession(
        lease, kernel_id=KERNEL, log=logging.getLogger("test"), tell=told.tell, touch=told.touch
    )
    return kernel, told


async def until(
    kernel: session.KernelSession, check: Callable[[], bool], within: float = 5
) -> None:
    """Wait for the session's next changes until `check` holds (bounded)."""
    async with asyncio.timeout(within):
        while not check():
            await kernel.wait_changed()


def state(kernel: session.KernelSession) -> KernelState:
    assert kernel.tracker is not None
    return kernel.tracker.lifecycle.state


async def launched(kernel: session.KernelSession, **timeouts: float) -> asyncio.Task[Any]:
    """Start a launch and return it once its group is followed."""
    task = asyncio.ensure_future(
        kernel.launch(
            group_spec(),
            admission_timeout=timeouts.get("admission", 0),
            startup_timeout=timeouts.get("startup", 60),
        )
    )
    await polling.until(  # each turn lets the launch task take its next step
        lambda: kernel.tracker is not None and kernel.tracker.observed.is_set(),
        "the launch following its group",
        within=5,
        every=0,
    )
    return task


async def test_a_launch_returns_once_the_kernel_answers_not_when_its_process_runs() -> None:
    fake = FakeBackend()
    kernel, told = new_session(fake)
    launch = await launched(kernel)
    fake.admit(KERNEL)
    fake.run(KERNEL, answering=False)
    await until(kernel, lambda: kernel.tracker is not None and kernel.tracker.status.kernel_alive)
    assert state(kernel) is S.ADMITTED and not launch.done()
    fake.answer(KERNEL)
    await launch
    assert state(kernel) is S.RUNNING
    assert [s for s, _ in told.sentences] == [S.QUEUED, S.ADMITTED, S.RUNNING]
    assert kernel.connection()["hb_port"] == fake.group(KERNEL).ref.connection.hb_port
    await kernel.release()


async def test_the_user_is_told_each_new_sentence_once_and_kept_active_while_waiting() -> None:
    fake = FakeBackend()
    kernel, told = new_session(fake)
    launch = await launched(kernel)
    fake.queue(KERNEL, 2, 3)
    fake.queue(KERNEL, 2, 3, message="")  # the same place again: nothing new to say
    fake.queue(KERNEL, 1, 3)
    await until(kernel, lambda: len(told.sentences) == 3)
    assert [m for _, m in told.sentences] == [
        "queued in 'gpu', position 1 of 1, needs 1 GPU",
        "queued in 'gpu', position 2 of 3, needs 1 GPU",
        "queued in 'gpu', position 1 of 3, needs 1 GPU",
    ]
    touched = told.touches
    assert kernel.poll() is None and kernel.waiting and kernel.waiting_since is not None
    assert told.touches == touched + 1  # each poll of a waiting kernel keeps it active
    await kernel.cancel()
    with pytest.raises(errors.LaunchCancelled, match="shut down while waiting in 'gpu'"):
        await launch
    assert [r.kernel_id for r in fake.released] == [KERNEL]
    assert kernel.tracker is None and kernel.poll() == 0


async def test_poll_reports_a_preempted_kernel_alive_and_an_ended_one_with_its_code() -> None:
    fake = FakeBackend(runs_at_once=True)
    kernel, told = new_session(fake)
    await (await launched(kernel))
    fake.evict(KERNEL)
    await until(kernel, lambda: state(kernel) is S.PREEMPTED)
    assert kernel.poll() is None
    fake.queue(KERNEL, 1, 1)
    fake.admit(KERNEL)
    fake.run(KERNEL)
    await until(kernel, lambda: state(kernel) is S.RESUMED)
    assert told.sentences[-1] == (
        S.RESUMED,
        "resumed; the kernel restarted fresh, variables were not restored",
    )
    fake.finish(KERNEL, 3)
    await until(kernel, lambda: state(kernel) is S.FINISHED)
    assert kernel.poll() == 3
    await kernel.release()


async def test_a_group_that_failed_polls_as_exit_code_one() -> None:
    fake = FakeBackend(runs_at_once=True)
    kernel, _ = new_session(fake)
    await (await launched(kernel))
    fake.fail(KERNEL, "the node is gone")
    await until(kernel, lambda: state(kernel) is S.FAILED)
    assert kernel.poll() == 1
    assert kernel.message() == "kernel 0b9f7a52 failed: the node is gone"
    assert kernel.tracker is not None
    await kernel.tracker.release()  # joins the release the failure started
    assert len(fake.released) == 1


@pytest.mark.parametrize("sees_processes", [True, False], ids=["local", "pods"])
async def test_a_restart_in_place_keeps_the_admission_and_tells_nothing_new(
    sees_processes: bool,
) -> None:
    fake = FakeBackend(runs_at_once=True, tracks_kernel_restarts=sees_processes)
    kernel, told = new_session(fake)
    await (await launched(kernel))
    before = list(told.sentences)

    watch_heartbeat = kernel.shutdown_requested(restart=True)
    assert watch_heartbeat is not sees_processes
    assert state(kernel) is S.RESTARTING
    assert kernel.poll() is None  # the old kernel still runs
    assert kernel.cause(StopCause.SHUTDOWN) is StopCause.RESTART
    fake.kernel_exits(KERNEL)  # the launcher restarts the kernel it was asked to
    if watch_heartbeat:
        await kernel.await_old_kernel()
    else:
        await until(kernel, lambda: kernel.poll() == 0)
    assert kernel.poll() == 0  # jupyter's shutdown of the old kernel ends
    fake.kernel_starts(KERNEL)
    await kernel.launch(None, admission_timeout=0, startup_timeout=5)
    assert state(kernel) is S.RUNNING and not kernel.restarting
    assert len(fake.submitted) == 1  # never queued again
    assert told.sentences == before
    await kernel.release()


async def test_a_restart_that_never_comes_back_fails_and_releases_the_kernel() -> None:
    fake = FakeBackend(runs_at_once=True)
    kernel, _ = new_session(fake)
    await (await launched(kernel))
    kernel.shutdown_requested(restart=True)
    with pytest.raises(errors.StartupTimeout, match="did not come back within 0 s of a restart"):
        await kernel.launch(None, admission_timeout=0, startup_timeout=0.1)
    assert state(kernel) is S.FAILED
    assert len(fake.released) == 1


async def test_stops_take_the_kernels_grace_and_a_kill_none() -> None:
    fake = FakeBackend(runs_at_once=True)
    kernel, _ = new_session(fake)
    await kernel.launch(group_spec(grace=12), admission_timeout=0, startup_timeout=5)
    await kernel.stop(StopCause.SHUTDOWN)
    fake.run(KERNEL)
    await kernel.stop(StopCause.KILL)
    assert fake.group(KERNEL).stops == [(StopCause.SHUTDOWN, 12), (StopCause.KILL, 0)]
    await kernel.release()


async def test_a_release_that_failed_keeps_the_submission_until_one_succeeds() -> None:
    fake = FakeBackend(runs_at_once=True)
    kernel, _ = new_session(fake)
    await (await launched(kernel))
    fake.fail_next("release", errors.ClusterUnavailable(503, "Unavailable", "the API is down"))
    with pytest.raises(errors.ClusterUnavailable):
        await kernel.release()
    assert kernel.tracker is not None  # still held: the next cleanup tries again
    await kernel.release()
    assert kernel.tracker is None
    assert len(fake.released) == 1  # the failed call raised before the backend recorded it


async def test_the_last_counted_lease_closes_its_owners_backends() -> None:
    fake = FakeBackend()
    owner = Owner()
    fake.serve(owner)
    first = backends.BackendLease("local", owner=owner, config=None, log=None, counted=True)
    second = backends.BackendLease("local", owner=owner, config=None, log=None, counted=True)
    await first.aclose()
    assert not fake.closed
    await second.aclose()
    assert fake.closed
    uncounted = FakeBackend()
    other = Owner()
    uncounted.serve(other)
    await backends.BackendLease("local", owner=other, config=None, log=None).aclose()
    assert not uncounted.closed  # the kernel manager closes it at its shutdown


async def test_a_reattached_group_polls_alive_and_a_gone_one_as_ended() -> None:
    fake = FakeBackend(runs_at_once=True)
    kernel, _ = new_session(fake)
    await (await launched(kernel))
    assert kernel.tracker is not None
    ref = kernel.tracker.ref
    await kernel.aclose()

    again, _ = new_session(fake)
    await again.reattach(ref, queue="gpu", within=5)
    assert again.poll() is None
    await until(again, lambda: state(again) is S.RUNNING)
    assert again.message() == "running"  # what it needs is not known after a restart
    fake.finish(KERNEL, 0)
    gone, _ = new_session(FakeBackend())
    await gone.reattach(ref, queue="gpu", within=5)
    assert gone.poll() == 0


# -- the provisioner over the session ----------------------------------------------------------


class Manager(LoggingConfigurable):
    """The parts of jupyter_server's kernel manager a provisioner touches."""

    reason = Unicode("")
    last_activity = AnyTrait(None)
    kernel_name = "fake"


@dataclass
class Launching:
    """A provisioner on a fake backend whose launch is under way, as a kernel manager starts
    one: its manager, the backend, the session the server extension reads, the launch."""

    prov: QueuedKernelProvisioner
    manager: Manager
    fake: FakeBackend
    kernel: session.KernelSession
    launch: asyncio.Future[Any]


async def launching() -> Launching:
    owner = Owner()
    fake = FakeBackend().serve(owner)
    manager = Manager(parent=owner)
    spec = KernelSpec(argv=["python", "-f", "{connection_file}"], display_name="fake")
    prov = QueuedKernelProvisioner(
        kernel_id=KERNEL, kernel_spec=spec, parent=manager, backend="local", queue="gpu", gpus=1
    )
    kwargs = await prov.pre_launch()
    kernel = prov.kernel_session
    assert kernel is not None  # the server extension reads its state there
    launch = asyncio.ensure_future(prov.launch_kernel(kwargs.pop("cmd"), **kwargs))
    return Launching(prov, manager, fake, kernel, launch)


async def test_the_provisioner_queues_restarts_in_place_and_releases_through_its_session() -> None:
    started = await launching()
    prov, manager, fake, kernel = started.prov, started.manager, started.fake, started.kernel
    await polling.until(
        lambda: manager.reason, "a reason told to the kernel manager", within=5, every=0
    )
    assert manager.reason == "queued in 'gpu', position 1 of 1, needs 1 GPU"
    assert manager.last_activity is not None
    assert await prov.poll() is None and kernel.waiting and prov.has_process
    assert (kernel.queue_status() or {})["state"] == "queued"
    fake.admit(KERNEL)
    fake.run(KERNEL)
    info = await started.launch
    assert isinstance(info["key"], bytes) and info["ip"] == "127.0.0.1"
    assert manager.reason == ""

    await prov.shutdown_requested(restart=True)
    assert await prov.poll() is None
    fake.restart_in_place(KERNEL)
    assert await prov.wait() == 0
    await prov.cleanup(restart=True)
    kwargs = await prov.pre_launch()
    await prov.launch_kernel(kwargs.pop("cmd"), **kwargs)
    assert prov.kernel_session is kernel  # the same session across a restart in place
    assert len(fake.submitted) == 1 and (kernel.queue_status() or {})["state"] == "running"

    fake.fail_next("release", errors.ClusterUnavailable(503, "Unavailable", "the API is down"))
    with pytest.raises(errors.ClusterUnavailable):
        await prov.cleanup(restart=False)
    assert prov.has_process  # kept until its release succeeded
    await prov.cleanup(restart=False)
    assert not prov.has_process and await prov.poll() == 0


async def test_the_provisioner_cancels_a_queued_launch() -> None:
    started = await launching()
    prov, manager, fake, kernel = started.prov, started.manager, started.fake, started.kernel
    await polling.until(
        lambda: kernel.waiting, "the launch waiting in the queue", within=5, every=0
    )
    await prov.cancel_launch()
    with pytest.raises(errors.LaunchCancelled):
        await started.launch
    assert not prov.has_process and len(fake.released) == 1
    assert manager.reason == "cancelled while waiting in 'gpu'"


@pytest.mark.parametrize(
    "kept",
    [
        None,
        "parked",
        ["kernel"],
        {},  # an older front end's info: nothing kept
        {"queue": "gpu"},  # no kernel id
        {"kernel_id": 7, "queue": "gpu"},
        {"kernel_id": "k", "queue": "gpu", "gpus": "1"},
        {"kernel_id": "k", "queue": "gpu", "parked_why": {"x": 1}},
    ],
)
def test_what_a_front_end_kept_that_is_not_a_noted_kernel_is_ignored(kept: Any) -> None:
    assert Noted.from_dict(kept) is None


def test_what_a_front_end_keeps_of_a_kernel_reads_back_the_same() -> None:
    noted = Noted("k", "gpu", 2, "2 GPUs", True, "after 30 min idle", "2026-12-02T03:00:00+00:00")
    assert Noted.from_dict(json.loads(json.dumps(noted.to_dict()))) == noted
    assert Noted.from_dict({**noted.to_dict(), "later": "a newer field"}) == noted
