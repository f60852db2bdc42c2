"""The tracker between a backend's status stream and a waiting launch, on a scripted backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kernel_queue import errors
from kernel_queue.lifecycle import KernelState, Lifecycle
from kernel_queue.model import ConnectionInfo, GroupPhase, GroupRef, GroupStatus
from kernel_queue.tracking import KernelTracker

CONNECTION = ConnectionInfo("10.0.0.1", 1, 2, 3, 4, 5, "key")


class ScriptedBackend:
    """Reports the given statuses, then nothing more; counts releases."""

    name = "scripted"
    tracks_kernel_restarts = False

    def __init__(self, *statuses: GroupStatus) -> None:
        self.statuses, self.released = statuses, 0

    async def watch(self, ref: GroupRef) -> AsyncIterator[GroupStatus]:
        for status in self.statuses:
            yield status
        await asyncio.Event().wait()

    async def release(self, ref: GroupRef) -> None:
        self.released += 1


def tracked(backend: ScriptedBackend, seen: list[KernelState]) -> KernelTracker:
    ref = GroupRef("scripted", "g", "kernel-1", CONNECTION)

    def notify(state: Lifecycle, status: GroupStatus) -> None:
        seen.append(state.state)

    tracker = KernelTracker(backend, ref, queue="gpu", notify=notify)  # type: ignore[arg-type]
    tracker.start()
    return tracker


async def test_a_kernel_preempted_while_starting_still_ends_its_wait_at_admission_timeout() -> None:
    backend = ScriptedBackend(
        GroupStatus(GroupPhase.QUEUED),
        GroupStatus(GroupPhase.ADMITTED),
        GroupStatus(GroupPhase.EVICTED, message="preempted by kernel 2"),
    )
    seen: list[KernelState] = []
    tracker = tracked(backend, seen)
    try:
        with pytest.raises(errors.AdmissionTimeout, match="without being admitted"):
            await tracker.wait_live(admission_timeout=0.3, startup_timeout=60)
    finally:
        await tracker.aclose()
    assert seen[-1] is KernelState.FAILED
    assert len(seen) < 10, seen  # one notification per change: no busy loop past the deadline
    assert backend.released == 1


async def test_release_happens_once_whoever_asks() -> None:
    backend = ScriptedBackend(GroupStatus(GroupPhase.QUEUED))
    tracker = tracked(backend, [])
    await tracker.release()
    await tracker.release()
    await tracker.aclose()
    assert backend.released == 1


def test_the_address_is_the_pods_when_the_backend_reports_one() -> None:
    tracker = KernelTracker(
        ScriptedBackend(),  # type: ignore[arg-type]
        GroupRef("scripted", "g", "kernel-1", CONNECTION),
        queue="gpu",
        notify=lambda state, status: None,
    )
    assert tracker.address == "10.0.0.1"
    tracker.status = GroupStatus(GroupPhase.RUNNING, address="127.10.0.7")
    assert tracker.address == "127.10.0.7"


async def test_a_wait_keeps_its_start_across_positions_and_a_preemption_starts_a_new_one() -> None:
    tracker = tracked(ScriptedBackend(), [])
    await tracker.observe(GroupPhase.QUEUED)
    began = tracker.waiting_since
    assert began is not None
    await tracker.observe(GroupPhase.QUEUED)  # moved up a place
    assert tracker.waiting_since is began
    await tracker.observe(GroupPhase.RUNNING)
    assert tracker.waiting_since is None
    await tracker.observe(GroupPhase.EVICTED)
    preempted = tracker.waiting_since
    assert preempted is not None and preempted >= began
    await tracker.observe(GroupPhase.QUEUED)  # requeued: the same wait
    assert tracker.waiting_since is preempted
    await tracker.aclose()


class FailingOnce(ScriptedBackend):
    """Its first release fails (a cluster hiccup), the next ones succeed."""

    async def release(self, ref: GroupRef) -> None:
        self.released += 1
        if self.released == 1:
            raise errors.ClusterUnavailable(503, "ServiceUnavailable", "the API server is down")


async def test_a_release_that_failed_runs_again_on_the_next_call_then_never() -> None:
    backend = FailingOnce(GroupStatus(GroupPhase.QUEUED))
    tracker = tracked(backend, [])
    with pytest.raises(errors.ClusterUnavailable):
        await tracker.release()
    await tracker.release()  # not the first call's failure again: a new try
    await tracker.release()
    await tracker.aclose()
    assert backend.released == 2


async def test_a_cancel_whose_release_fails_still_fails_the_launch_with_its_own_cause() -> None:
    from kernel_queue.lifecycle import Command

    backend = FailingOnce(GroupStatus(GroupPhase.QUEUED))
    tracker = tracked(backend, [])
    await tracker.wait_changed()
    await tracker.observe(Command.CANCEL)  # the release fails inside: nothing raises here
    with pytest.raises(errors.LaunchCancelled):
        await tracker.wait_live(admission_timeout=0, startup_timeout=60)
    await tracker.release()  # the shutdown's clean-up tries again, and succeeds
    await tracker.aclose()
    assert backend.released == 2


async def test_a_request_the_queue_can_never_admit_fails_at_once_as_never_fits() -> None:
    never = (
        "asks for 3 nvidia.com/gpu but ClusterQueue 'gpu-cq' can never give more than 2, so it "
        "could never start. Ask for fewer `gpus` in the kernelspec, or use a `queue` whose "
        "ClusterQueue has more."
    )
    backend = ScriptedBackend(
        GroupStatus(GroupPhase.QUEUED),
        GroupStatus(GroupPhase.FAILED, message=never, never_fits=True, has={"gpus": 2}),
    )
    tracker = tracked(backend, [])
    try:
        with pytest.raises(errors.NeverFits) as failed:
            await tracker.wait_live(admission_timeout=0, startup_timeout=60)
    finally:
        await tracker.aclose()
    assert str(failed.value) == f"kernel kernel1 {never}"
    assert failed.value.has == {"gpus": 2}  # the status event's `has`
    assert tracker.describe(needs="3 GPUs", restored=False) == f"kernel kernel1 {never}"
    assert backend.released == 1


async def test_a_wait_cancelled_as_the_status_changes_is_cancelled() -> None:
    """A launch's wait is cancelled (a DELETE of a starting kernel) in the same turn of the
    loop as a change wakes it: Python 3.11's asyncio.wait_for then returned instead of raising,
    and the wait went on for the next change or its timeout."""
    tracker = tracked(ScriptedBackend(GroupStatus(GroupPhase.QUEUED)), [])
    try:
        waiting = asyncio.create_task(tracker.wait_live(admission_timeout=60, startup_timeout=60))
        await asyncio.sleep(0.1)  # queued, waiting for a change
        assert not waiting.done()
        tracker._changed.set()  # a change (a position, say) wakes the wait ...
        waiting.cancel()  # ... as the launch is cancelled
        await asyncio.wait({waiting}, timeout=5)
        assert waiting.done(), "the cancelled wait went on"
        assert waiting.cancelled()
    finally:
        await tracker.aclose()
