"""Table tests of the pure kernel state machine and the sentences users read."""

from __future__ import annotations

import pytest

from kernel_queue.lifecycle import Action, Command, KernelState, Lifecycle, describe, shown, step
from kernel_queue.model import GroupPhase, GroupStatus, QueuePlace, Waiting

S, P, A = KernelState, GroupPhase, Action
RELEASE, FAIL = A.RELEASE, A.FAIL


@pytest.mark.parametrize(
    ("state", "preemptions", "observed", "expected_state", "expected_preemptions", "actions"),
    [
        pytest.param(S.QUEUED, 0, P.QUEUED, S.QUEUED, 0, set(), id="queued-position-update"),
        pytest.param(S.QUEUED, 0, P.PENDING, S.QUEUED, 0, set(), id="pending-stays-queued"),
        pytest.param(S.QUEUED, 0, P.ADMITTED, S.ADMITTED, 0, set(), id="admission"),
        pytest.param(S.QUEUED, 0, P.RUNNING, S.RUNNING, 0, set(), id="admitted-and-ready-at-once"),
        pytest.param(S.ADMITTED, 0, P.RUNNING, S.RUNNING, 0, set(), id="ready-connects"),
        pytest.param(S.ADMITTED, 0, P.QUEUED, S.QUEUED, 0, set(), id="admission-lost-requeues"),
        pytest.param(S.RUNNING, 0, P.EVICTED, S.PREEMPTED, 1, set(), id="running-preempted"),
        pytest.param(S.ADMITTED, 0, P.EVICTED, S.PREEMPTED, 1, set(), id="starting-preempted"),
        pytest.param(S.PREEMPTED, 1, P.QUEUED, S.REQUEUED, 1, set(), id="preempted-requeued"),
        pytest.param(S.PREEMPTED, 1, P.EVICTED, S.PREEMPTED, 1, set(), id="eviction-repeats"),
        pytest.param(S.REQUEUED, 1, P.FINISHED, S.FINISHED, 1, set(), id="stopped-while-requeued"),
        pytest.param(
            S.PREEMPTED, 1, P.FINISHED, S.FINISHED, 1, set(), id="stopped-while-preempted"
        ),
        pytest.param(S.REQUEUED, 1, P.QUEUED, S.REQUEUED, 1, set(), id="requeued-moves-up"),
        pytest.param(S.REQUEUED, 1, P.ADMITTED, S.ADMITTED, 1, set(), id="readmitted"),
        pytest.param(S.ADMITTED, 1, P.RUNNING, S.RESUMED, 1, set(), id="readmitted-resumes"),
        pytest.param(S.REQUEUED, 1, P.RUNNING, S.RESUMED, 1, set(), id="requeued-resumes"),
        pytest.param(S.RESUMED, 1, P.EVICTED, S.PREEMPTED, 2, set(), id="preempted-twice"),
        pytest.param(S.RUNNING, 0, P.QUEUED, S.REQUEUED, 1, set(), id="missed-eviction-counts"),
        pytest.param(S.RUNNING, 0, P.RUNNING, S.RUNNING, 0, set(), id="running-repeats"),
        pytest.param(S.RUNNING, 0, P.FINISHED, S.FINISHED, 0, set(), id="kernel-exits"),
        pytest.param(
            S.ADMITTED, 0, P.FINISHED, S.FAILED, 0, {FAIL, RELEASE}, id="exit-before-ready"
        ),
        pytest.param(S.RUNNING, 0, P.FAILED, S.FAILED, 0, {FAIL, RELEASE}, id="running-fails"),
        pytest.param(
            S.QUEUED, 0, Command.CANCEL, S.CANCELLED, 0, {FAIL, RELEASE}, id="cancel-queued"
        ),
        pytest.param(
            S.REQUEUED,
            1,
            Command.CANCEL,
            S.CANCELLED,
            1,
            {FAIL, RELEASE},
            id="cancel-requeued",
        ),
        pytest.param(S.RUNNING, 0, Command.CANCEL, S.RUNNING, 0, set(), id="cancel-ignored-live"),
        pytest.param(
            S.QUEUED,
            0,
            Command.ADMISSION_TIMEOUT,
            S.FAILED,
            0,
            {FAIL, RELEASE},
            id="admission-timeout",
        ),
        pytest.param(
            S.ADMITTED, 0, Command.ADMISSION_TIMEOUT, S.ADMITTED, 0, set(), id="timeout-too-late"
        ),
        pytest.param(
            S.PREEMPTED,
            1,
            Command.ADMISSION_TIMEOUT,
            S.FAILED,
            1,
            {FAIL, RELEASE},
            id="admission-timeout-after-a-preemption-while-starting",
        ),
        pytest.param(
            S.REQUEUED,
            1,
            Command.ADMISSION_TIMEOUT,
            S.FAILED,
            1,
            {FAIL, RELEASE},
            id="admission-timeout-while-requeued-before-first-run",
        ),
        pytest.param(
            S.ADMITTED,
            0,
            Command.STARTUP_TIMEOUT,
            S.FAILED,
            0,
            {FAIL, RELEASE},
            id="startup-timeout",
        ),
        pytest.param(S.RUNNING, 0, Command.RESTART, S.RESTARTING, 0, set(), id="restart-in-place"),
        pytest.param(
            S.RESUMED, 1, Command.RESTART, S.RESTARTING, 1, set(), id="restart-of-a-resumed-kernel"
        ),
        pytest.param(S.QUEUED, 0, Command.RESTART, S.QUEUED, 0, set(), id="restart-keeps-a-place"),
        pytest.param(
            S.ADMITTED, 0, Command.RESTART, S.ADMITTED, 0, set(), id="restart-while-starting"
        ),
        pytest.param(
            S.RESTARTING, 0, P.RUNNING, S.RESTARTING, 0, set(), id="restarting-pod-still-runs"
        ),
        pytest.param(S.RESTARTING, 0, Command.RESTARTED, S.RUNNING, 0, set(), id="restarted-runs"),
        pytest.param(
            S.RESTARTING, 2, Command.RESTARTED, S.RESUMED, 2, set(), id="restarted-after-preemption"
        ),
        pytest.param(
            S.RUNNING, 0, Command.RESTARTED, S.RUNNING, 0, set(), id="restarted-without-a-restart"
        ),
        pytest.param(
            S.RESTARTING, 0, P.EVICTED, S.PREEMPTED, 1, set(), id="preempted-while-restarting"
        ),
        pytest.param(
            S.RESTARTING, 0, P.QUEUED, S.REQUEUED, 1, set(), id="requeued-while-restarting"
        ),
        pytest.param(
            S.RESTARTING, 0, P.FINISHED, S.FINISHED, 0, set(), id="group-ended-while-restarting"
        ),
        pytest.param(
            S.RESTARTING,
            0,
            P.FAILED,
            S.FAILED,
            0,
            {FAIL, RELEASE},
            id="group-failed-while-restarting",
        ),
        pytest.param(
            S.RESTARTING,
            0,
            Command.STARTUP_TIMEOUT,
            S.FAILED,
            0,
            {FAIL, RELEASE},
            id="restart-never-came-back",
        ),
        pytest.param(
            S.RESTARTING, 0, Command.CANCEL, S.RESTARTING, 0, set(), id="cancel-ignored-restarting"
        ),
        pytest.param(
            S.RESTARTING,
            0,
            Command.ADMISSION_TIMEOUT,
            S.RESTARTING,
            0,
            set(),
            id="restarting-keeps-its-admission",
        ),
        pytest.param(S.FINISHED, 0, P.RUNNING, S.FINISHED, 0, set(), id="finished-absorbs"),
        pytest.param(S.CANCELLED, 0, P.ADMITTED, S.CANCELLED, 0, set(), id="cancelled-absorbs"),
        pytest.param(S.FAILED, 0, Command.CANCEL, S.FAILED, 0, set(), id="failed-absorbs"),
    ],
)
def test_step(
    state: KernelState,
    preemptions: int,
    observed: GroupPhase | Command,
    expected_state: KernelState,
    expected_preemptions: int,
    actions: set[Action],
) -> None:
    transition = step(Lifecycle(state, preemptions), observed)
    assert transition.lifecycle == Lifecycle(expected_state, expected_preemptions)
    assert transition.actions == actions


def _status(phase: GroupPhase, **kw: object) -> GroupStatus:
    return GroupStatus(phase, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lifecycle", "status", "text"),
    [
        pytest.param(
            Lifecycle(S.QUEUED),
            _status(P.QUEUED, place=QueuePlace("gpu", 2, 3)),
            "queued in 'gpu', position 2 of 3, needs 1 GPU",
            id="queued",
        ),
        pytest.param(
            Lifecycle(S.QUEUED),
            _status(P.PENDING),
            "queued in 'gpu', needs 1 GPU",
            id="queued-no-position-yet",
        ),
        pytest.param(
            Lifecycle(S.ADMITTED),
            _status(P.ADMITTED, flavor="local", devices=("1",)),
            "admitted on flavor 'local' with GPU 1; starting the kernel",
            id="admitted",
        ),
        pytest.param(
            Lifecycle(S.RUNNING),
            _status(P.RUNNING, devices=("0", "1")),
            "running with GPUs 0, 1",
            id="running",
        ),
        pytest.param(
            Lifecycle(S.PREEMPTED, 1),
            _status(P.EVICTED, message="preempted by a higher-priority kernel"),
            "preempted by a higher-priority kernel; the kernel will wait in 'gpu' again",
            id="preempted",
        ),
        pytest.param(
            Lifecycle(S.PREEMPTED, 1),
            _status(P.EVICTED, message="the node is drained"),
            "preempted: the node is drained; the kernel will wait in 'gpu' again",
            id="preempted-for-another-reason",
        ),
        pytest.param(
            Lifecycle(S.PREEMPTED, 1),
            _status(P.EVICTED),
            "preempted; the kernel will wait in 'gpu' again",
            id="preempted-without-a-reason",
        ),
        pytest.param(
            Lifecycle(S.REQUEUED, 1),
            _status(P.QUEUED, place=QueuePlace("gpu", 1, 1)),
            "preempted; requeued in 'gpu', position 1 of 1, needs 1 GPU",
            id="requeued",
        ),
        pytest.param(
            Lifecycle(S.QUEUED),
            _status(
                P.QUEUED,
                place=QueuePlace("gpu", 3, 5),
                waiting=Waiting("waiting for 1 more nvidia.com/gpu to free up", estimate=240.0),
            ),
            "queued in 'gpu', position 3 of 5, needs 1 GPU; waiting for 1 more nvidia.com/gpu "
            "to free up; about 4 min at the recent rate",
            id="queued-says-why-and-how-long",
        ),
        pytest.param(
            Lifecycle(S.QUEUED),
            _status(P.QUEUED, place=QueuePlace("gpu", 1, 1), waiting=Waiting(estimate=40.0)),
            "queued in 'gpu', position 1 of 1, needs 1 GPU; about 40 s at the recent rate",
            id="queued-with-only-an-estimate",
        ),
        pytest.param(
            Lifecycle(S.QUEUED),
            _status(
                P.PENDING,
                waiting=Waiting("no Workload after 30 s: is Kueue running?", answered=False),
            ),
            "Kueue does not answer: no Workload after 30 s: is Kueue running? The kernel keeps "
            "waiting for 'gpu' (needs 1 GPU).",
            id="kueue-does-not-answer",
        ),
        pytest.param(
            Lifecycle(S.REQUEUED, 1),
            _status(
                P.QUEUED,
                message="saved 2 variables",
                place=QueuePlace("gpu", 1, 1),
                waiting=Waiting("LocalQueue 'gpu' is stopped", estimate=None),
            ),
            "preempted (saved 2 variables); requeued in 'gpu', position 1 of 1, needs 1 GPU; "
            "LocalQueue 'gpu' is stopped",
            id="requeued-says-why",
        ),
        pytest.param(
            Lifecycle(S.REQUEUED, 1),
            _status(
                P.QUEUED,
                place=QueuePlace("gpu", 2, 2),
                interrupted="its launcher was killed by SIGKILL (exit 137)",
            ),
            "stopped without warning (its launcher was killed by SIGKILL (exit 137)); requeued "
            "in 'gpu', position 2 of 2, needs 1 GPU, to start again fresh",
            id="requeued-after-a-lost-launcher",
        ),
        pytest.param(
            Lifecycle(S.RESUMED, 1),
            _status(P.RUNNING, devices=("0",)),
            "resumed with GPU 0; the kernel restarted fresh, variables were not restored",
            id="resumed-fresh",
        ),
        pytest.param(
            Lifecycle(S.CANCELLED),
            _status(P.QUEUED),
            "cancelled while waiting in 'gpu'",
            id="cancelled",
        ),
        pytest.param(
            Lifecycle(S.FAILED),
            _status(P.FAILED, message="the launcher could not start"),
            "the launcher could not start",
            id="failed",
        ),
    ],
)
def test_describe(lifecycle: Lifecycle, status: GroupStatus, text: str) -> None:
    assert describe(lifecycle, status, queue="gpu", needs="1 GPU") == text


def test_a_kernel_whose_needs_are_unknown_is_described_without_them() -> None:
    status = _status(P.QUEUED, place=QueuePlace("gpu", 1, 2))
    text = describe(Lifecycle(S.QUEUED), status, queue="gpu", needs="")
    assert text == "queued in 'gpu', position 1 of 2"


@pytest.mark.parametrize(
    ("lifecycle", "state"),
    [
        pytest.param(Lifecycle(S.RESTARTING), S.RUNNING, id="restarting-shows-running"),
        pytest.param(Lifecycle(S.RESTARTING, 1), S.RESUMED, id="restarting-shows-resumed"),
        pytest.param(Lifecycle(S.QUEUED), S.QUEUED, id="others-show-themselves"),
    ],
)
def test_a_restart_in_place_is_shown_as_the_kernel_it_restarts(
    lifecycle: Lifecycle, state: KernelState
) -> None:
    assert shown(lifecycle) is state


def test_a_restart_in_place_keeps_the_sentence_of_the_running_kernel() -> None:
    status = _status(P.RUNNING, devices=("0",))
    for preemptions in (0, 1):
        before = describe(
            Lifecycle(shown(Lifecycle(S.RESTARTING, preemptions)), preemptions),
            status,
            queue="gpu",
            needs="1 GPU",
        )
        during = describe(Lifecycle(S.RESTARTING, preemptions), status, queue="gpu", needs="1 GPU")
        assert during == before


@pytest.mark.parametrize(
    ("before", "observed", "after"),
    [
        pytest.param(
            Lifecycle(S.RUNNING), P.PARKING, Lifecycle(S.PARKED, parks=1), id="running-parks"
        ),
        pytest.param(
            Lifecycle(S.RESUMED, 1), P.PARKED, Lifecycle(S.PARKED, 1, 1), id="resumed-parks"
        ),
        pytest.param(
            Lifecycle(S.PARKED, parks=1),
            P.PARKED,
            Lifecycle(S.PARKED, parks=1),
            id="saved-while-parked-counts-once",
        ),
        pytest.param(
            Lifecycle(S.PARKED, parks=1),
            P.QUEUED,
            Lifecycle(S.REQUEUED, parks=1, waking=True),
            id="woken-waits-as-requeued-not-preempted",
        ),
        pytest.param(
            Lifecycle(S.REQUEUED, parks=1, waking=True),
            P.ADMITTED,
            Lifecycle(S.ADMITTED, parks=1, waking=True),
            id="woken-admitted",
        ),
        pytest.param(
            Lifecycle(S.ADMITTED, parks=1, waking=True),
            P.RUNNING,
            Lifecycle(S.RESUMED, parks=1),
            id="woken-comes-back-resumed",
        ),
        pytest.param(
            Lifecycle(S.ADMITTED, parks=1, waking=True),
            P.EVICTED,
            Lifecycle(S.PREEMPTED, 1, 1),
            id="woken-then-preempted-is-a-preemption",
        ),
        pytest.param(
            Lifecycle(S.PARKED, parks=1),
            P.FINISHED,
            Lifecycle(S.FINISHED, parks=1),
            id="shut-down-while-parked",
        ),
        # Only a live kernel is parked (the park is refused otherwise), so a tracker that begins
        # (QUEUED) and finds its group parked adopted it after a restart: it is parked.
        pytest.param(
            Lifecycle(S.QUEUED),
            P.PARKED,
            Lifecycle(S.PARKED, parks=1),
            id="an-adopted-group-found-parked-is-parked",
        ),
    ],
)
def test_parking_steps(before: Lifecycle, observed: GroupPhase, after: Lifecycle) -> None:
    assert step(before, observed).lifecycle == after


def test_a_parked_kernel_that_fails_releases_and_fails() -> None:
    transition = step(Lifecycle(S.PARKED, parks=1), P.FAILED)
    assert transition.lifecycle.state is S.FAILED
    assert transition.actions == {RELEASE, FAIL}


@pytest.mark.parametrize(
    ("lifecycle", "status", "kw", "text"),
    [
        pytest.param(
            Lifecycle(S.PARKED, parks=1),
            _status(P.PARKING),
            {"parked": "after 30 min idle", "gpus": 1},
            "parking after 30 min idle: saving its variables, then giving back its GPU",
            id="parking",
        ),
        pytest.param(
            Lifecycle(S.PARKED, parks=1),
            _status(P.PARKED, message="saved 12 variables, 1.2 GB"),
            {"parked": "after 30 min idle", "gpus": 1, "restored": True},
            "parked after 30 min idle; GPU released; your next cell brings it back "
            "(saved 12 variables, 1.2 GB)",
            id="parked-as-the-issue-words-it",
        ),
        pytest.param(
            Lifecycle(S.PARKED, parks=1),
            _status(P.PARKED),
            {"gpus": 2, "restored": True},
            "parked on request; 2 GPUs released; your next cell brings it back",
            id="parked-on-request",
        ),
        pytest.param(
            Lifecycle(S.REQUEUED, parks=1, waking=True),
            _status(P.QUEUED, place=QueuePlace("gpu", 2, 3)),
            {"parked": "on request", "gpus": 1},
            "waking from parked: queued in 'gpu', position 2 of 3, needs 1 GPU",
            id="waking",
        ),
        pytest.param(
            Lifecycle(S.RESUMED, parks=1),
            _status(P.RUNNING, devices=("0",)),
            {"restored": True},
            "resumed with GPU 0; variables restored from the checkpoint (the notebook lists them)",
            id="back-from-parked",
        ),
    ],
)
def test_parked_sentences(
    lifecycle: Lifecycle, status: GroupStatus, kw: dict[str, object], text: str
) -> None:
    assert describe(lifecycle, status, queue="gpu", needs="1 GPU", **kw) == text  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(45, "45 s"), (1800, "30 min"), (5400, "1.5 h"), (7200, "2 h")],
)
def test_idle_words(seconds: float, words: str) -> None:
    from kernel_queue.lifecycle import idle_words

    assert idle_words(seconds) == words
