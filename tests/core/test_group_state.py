"""Table tests of the two group machines: the local backend's group (it drives its launcher, so
its stage is the whole truth) and the kubernetes backend's pod-group record (Kueue owns the
phase; the record keeps what the cluster cannot say again)."""

from __future__ import annotations

import pytest

from kernel_queue.backends.kubernetes import group_state as pod
from kernel_queue.backends.local import group_state as local
from kernel_queue.model import GroupPhase

S, E, A = local.Stage, local.Event, local.Action

# (stage, leaving, event) -> (stage, leaving, actions): every transition the local backend
# relies on, one row each.
LOCAL_MOVES = [
    pytest.param(S.QUEUED, False, E.ADMIT, S.ADMITTED, False, {A.START}, id="admitted"),
    pytest.param(S.ADMITTED, False, E.LAUNCH, S.RUNNING, False, set(), id="launcher-started"),
    pytest.param(
        S.RUNNING, False, E.PREEMPT, S.EVICTING, True, {A.SAY_EVICTED, A.TERM}, id="preempted"
    ),
    pytest.param(
        S.ADMITTED,
        False,
        E.PREEMPT,
        S.QUEUED,
        False,
        {A.SAY_EVICTED, A.REQUEUE},
        id="preempted-before-its-launcher-started",
    ),
    pytest.param(S.EVICTING, True, E.EXITED, S.QUEUED, False, {A.REQUEUE}, id="evicted-requeued"),
    pytest.param(
        S.RUNNING, False, E.RECLAIM, S.EVICTING, True, {A.KILL}, id="reclaimed-while-running"
    ),
    pytest.param(S.EVICTING, True, E.RECLAIM, S.EVICTING, True, {A.KILL}, id="eviction-outlived"),
    pytest.param(S.PARKING, True, E.RECLAIM, S.PARKING, True, {A.KILL}, id="parking-outlived"),
    pytest.param(
        S.PARKING_WAKE, True, E.RECLAIM, S.PARKING_WAKE, True, {A.KILL}, id="waking-outlived"
    ),
    pytest.param(S.ENDING, False, E.RECLAIM, S.ENDING, True, {A.KILL}, id="stop-outlived"),
    pytest.param(S.LOST, False, E.RECLAIM, S.LOST, True, {A.KILL}, id="lost-reclaimed"),
    pytest.param(
        S.RUNNING,
        False,
        E.PARK,
        S.PARKING,
        True,
        {A.SAY_PARKING, A.TERM, A.KILL_AFTER},
        id="park",
    ),
    pytest.param(S.PARKING, True, E.EXITED, S.PARKED, False, {A.PARKED}, id="parked"),
    pytest.param(S.PARKING, True, E.RESUME, S.PARKING_WAKE, True, set(), id="resume-while-parking"),
    pytest.param(
        S.PARKING_WAKE, True, E.RESUME, S.PARKING_WAKE, True, set(), id="second-resume-parking"
    ),
    pytest.param(
        S.PARKING_WAKE,
        True,
        E.EXITED,
        S.QUEUED,
        False,
        {A.PARKED, A.WAKE},
        id="parked-then-woken-at-once",
    ),
    pytest.param(S.PARKED, False, E.RESUME, S.QUEUED, False, {A.WAKE}, id="woken"),
    pytest.param(S.QUEUED, False, E.STOP, S.ENDED, False, {A.END}, id="stopped-while-queued"),
    pytest.param(S.PARKED, False, E.STOP, S.ENDED, False, {A.END}, id="stopped-while-parked"),
    pytest.param(
        S.ADMITTED, False, E.STOP, S.ENDED, False, {A.END}, id="stopped-before-its-launcher"
    ),
    pytest.param(S.INTERRUPTED, False, E.STOP, S.ENDED, False, {A.END}, id="stopped-while-buried"),
    pytest.param(S.RUNNING, False, E.STOP, S.ENDING, False, {A.STOP}, id="stop-a-running-kernel"),
    pytest.param(S.EVICTING, True, E.STOP, S.ENDING, True, {A.STOP}, id="stop-while-evicting"),
    pytest.param(S.PARKING, True, E.STOP, S.ENDING, True, {A.STOP}, id="stop-while-parking"),
    pytest.param(
        S.PARKING_WAKE, True, E.STOP, S.ENDING, True, {A.STOP}, id="stop-forgets-the-wake"
    ),
    pytest.param(S.ENDING, False, E.STOP, S.ENDING, False, {A.STOP}, id="stop-again"),
    pytest.param(S.ENDING, True, E.STOP, S.ENDING, True, {A.STOP}, id="stop-again-leaving"),
    pytest.param(S.LOST, False, E.STOP, S.LOST, False, {A.STOP}, id="stop-while-lost"),
    pytest.param(S.RUNNING, False, E.EXITED, S.ENDED, False, {A.END}, id="kernel-ended"),
    pytest.param(S.ENDING, False, E.EXITED, S.ENDED, False, {A.END}, id="stopped"),
    pytest.param(S.LOST, False, E.EXITED, S.ENDED, False, {A.END}, id="lost-launcher-exited"),
    pytest.param(S.QUEUED, False, E.LEASE_LOST, S.ENDED, False, {A.END}, id="refused"),
    pytest.param(S.ADMITTED, False, E.LEASE_LOST, S.ENDED, False, {A.END}, id="lease-lost-early"),
    pytest.param(S.PARKED, False, E.LEASE_LOST, S.ENDED, False, {A.END}, id="lease-lost-parked"),
    pytest.param(
        S.INTERRUPTED, False, E.LEASE_LOST, S.ENDED, False, {A.END}, id="lease-lost-burying"
    ),
    pytest.param(S.RUNNING, False, E.LEASE_LOST, S.LOST, False, {A.KILL}, id="lease-lost"),
    pytest.param(S.EVICTING, True, E.LEASE_LOST, S.LOST, True, {A.KILL}, id="lost-evicting"),
    pytest.param(S.PARKING, True, E.LEASE_LOST, S.LOST, True, {A.KILL}, id="lost-parking"),
    pytest.param(S.PARKING_WAKE, True, E.LEASE_LOST, S.LOST, True, {A.KILL}, id="lost-waking"),
    pytest.param(S.ENDING, False, E.LEASE_LOST, S.LOST, False, {A.KILL}, id="lost-ending"),
    pytest.param(S.LOST, False, E.LEASE_LOST, S.LOST, False, {A.KILL}, id="lost-again"),
    pytest.param(
        S.RUNNING, False, E.LAUNCHER_LOST, S.INTERRUPTED, False, {A.BURY}, id="killed-unasked"
    ),
    pytest.param(S.INTERRUPTED, False, E.BURIED, S.QUEUED, False, {A.REQUEUE}, id="buried"),
    pytest.param(S.ADMITTED, False, E.END, S.ENDED, False, {A.END}, id="cannot-start"),
    pytest.param(S.RUNNING, False, E.END, S.ENDED, False, {A.END}, id="launcher-never-ran"),
    pytest.param(S.INTERRUPTED, False, E.END, S.ENDED, False, {A.END}, id="lost-too-often"),
    pytest.param(S.ENDING, False, E.END, S.ENDED, False, {A.END}, id="released"),
    pytest.param(S.ENDING, True, E.END, S.ENDED, False, {A.END}, id="released-leaving"),
    pytest.param(S.QUEUED, False, E.END, S.ENDED, False, {A.END}, id="ended-queued"),
    pytest.param(S.PARKED, False, E.END, S.ENDED, False, {A.END}, id="ended-parked"),
    pytest.param(S.EVICTING, True, E.END, S.ENDED, False, {A.END}, id="ended-evicting"),
    pytest.param(S.PARKING, True, E.END, S.ENDED, False, {A.END}, id="ended-parking"),
    pytest.param(S.PARKING_WAKE, True, E.END, S.ENDED, False, {A.END}, id="ended-waking"),
    pytest.param(S.LOST, False, E.END, S.ENDED, False, {A.END}, id="ended-lost"),
]


@pytest.mark.parametrize(
    ("stage", "leaving", "event", "expected", "expected_leaving", "actions"), LOCAL_MOVES
)
def test_a_local_group_moves(
    stage: local.Stage,
    leaving: bool,
    event: local.Event,
    expected: local.Stage,
    expected_leaving: bool,
    actions: set[local.Action],
) -> None:
    moved = local.step(local.State(stage, leaving), event)
    assert moved.state == local.State(expected, expected_leaving)
    assert moved.actions == actions


# (stage, event): refused or ignored, the state and the backend untouched.
LOCAL_IGNORED = [
    pytest.param(S.ADMITTED, E.ADMIT, id="admitted-twice"),
    pytest.param(S.PARKED, E.ADMIT, id="a-parked-group-is-not-in-the-queue"),
    pytest.param(S.QUEUED, E.LAUNCH, id="no-launch-after-a-requeue"),
    pytest.param(S.ENDED, E.LAUNCH, id="no-launch-after-a-stop"),
    pytest.param(S.QUEUED, E.PREEMPT, id="preempt-without-an-admission"),
    pytest.param(S.PARKED, E.PREEMPT, id="preempt-a-parked-group"),
    pytest.param(S.EVICTING, E.PREEMPT, id="preempt-while-evicting"),
    pytest.param(S.PARKING, E.PREEMPT, id="parking-gives-its-gpus-back-already"),
    pytest.param(S.PARKING_WAKE, E.PREEMPT, id="waking-parker-gives-its-gpus-back-already"),
    pytest.param(S.ENDING, E.PREEMPT, id="an-ending-launcher-stops-already"),
    pytest.param(S.LOST, E.PREEMPT, id="a-lost-launcher-is-killed-already"),
    pytest.param(S.INTERRUPTED, E.PREEMPT, id="a-buried-launcher-requeues-after"),
    pytest.param(S.ADMITTED, E.RECLAIM, id="reclaim-without-a-launcher"),
    pytest.param(S.INTERRUPTED, E.RECLAIM, id="reclaim-after-the-launcher-died"),
    pytest.param(S.QUEUED, E.RECLAIM, id="reclaim-while-queued"),
    pytest.param(S.QUEUED, E.PARK, id="park-a-waiting-group"),
    pytest.param(S.ADMITTED, E.PARK, id="park-before-its-launcher"),
    pytest.param(S.EVICTING, E.PARK, id="park-while-evicting"),
    pytest.param(S.PARKING, E.PARK, id="park-twice"),
    pytest.param(S.PARKED, E.PARK, id="park-a-parked-group"),
    pytest.param(S.ENDING, E.PARK, id="park-while-ending"),
    pytest.param(S.LOST, E.PARK, id="park-while-lost"),
    pytest.param(S.INTERRUPTED, E.PARK, id="park-while-buried"),
    pytest.param(S.RUNNING, E.RESUME, id="resume-a-running-group"),
    pytest.param(S.QUEUED, E.RESUME, id="resume-a-waiting-group"),
    pytest.param(S.EVICTING, E.RESUME, id="resume-while-evicting"),
    pytest.param(S.ENDING, E.RESUME, id="resume-while-ending"),
    pytest.param(S.LOST, E.RESUME, id="resume-while-lost"),
    pytest.param(S.ENDED, E.STOP, id="stop-an-ended-group"),
    pytest.param(S.ENDED, E.LEASE_LOST, id="lease-lost-after-the-end"),
    pytest.param(S.ENDED, E.EXITED, id="exit-after-a-release"),
    pytest.param(S.QUEUED, E.EXITED, id="exit-without-a-launcher"),
    pytest.param(S.EVICTING, E.LAUNCHER_LOST, id="evicting-launcher-killed-is-its-exit"),
    pytest.param(S.ENDING, E.LAUNCHER_LOST, id="ending-launcher-killed-is-its-exit"),
    pytest.param(S.ENDED, E.BURIED, id="buried-after-a-stop"),
    pytest.param(S.QUEUED, E.BURIED, id="buried-twice"),
    pytest.param(S.ENDED, E.END, id="ended-twice"),
]


@pytest.mark.parametrize(("stage", "event"), LOCAL_IGNORED)
@pytest.mark.parametrize("leaving", [False, True])
def test_a_local_group_ignores(stage: local.Stage, event: local.Event, leaving: bool) -> None:
    before = local.State(stage, leaving)
    assert local.step(before, event) == local.Transition(before, frozenset())


def test_the_local_table_covers_every_pair() -> None:
    """Each (stage, event) is a listed move or a listed refusal: a new one is decided here."""
    moves = {(p.values[0], p.values[2]) for p in LOCAL_MOVES}
    ignored = {(p.values[0], p.values[1]) for p in LOCAL_IGNORED}
    unlisted = {
        (stage, event)
        for stage in S
        for event in E
        if (stage, event) not in moves | ignored
        and local.step(local.State(stage), event)
        != local.Transition(local.State(stage), frozenset())
    }
    assert unlisted == set()


def _run(*events: local.Event) -> list[local.State]:
    state, seen = local.State(), []
    for event in events:
        state = local.step(state, event).state
        seen.append(state)
    return seen


def test_a_park_with_a_resume_ends_queued_not_ended() -> None:
    """The park and wake race: a resume while parking is one wake once parked, and the group
    is queued again, not stopped."""
    states = _run(E.ADMIT, E.LAUNCH, E.PARK, E.RESUME, E.RESUME, E.EXITED, E.ADMIT, E.LAUNCH)
    assert [s.stage for s in states[2:]] == [
        S.PARKING,
        S.PARKING_WAKE,
        S.PARKING_WAKE,
        S.QUEUED,
        S.ADMITTED,
        S.RUNNING,
    ]
    assert not states[-1].leaving  # the woken kernel's start is news again


def test_a_preempted_kernel_stopped_keeps_its_kernel_events_quiet_until_it_ends() -> None:
    states = _run(E.ADMIT, E.LAUNCH, E.PREEMPT, E.STOP, E.EXITED)
    assert [(s.stage, s.leaving) for s in states[2:]] == [
        (S.EVICTING, True),
        (S.ENDING, True),
        (S.ENDED, False),
    ]


P = GroupPhase
PS, PA, D = pod.Stage, pod.Action, pod.Done


def _pod(stage: pod.Stage = PS.RAN, *, replacing: bool = False, wake: bool = False) -> pod.State:
    return pod.State(stage, replacing, wake)


# (state, event) -> (state, actions): every transition the kubernetes backend relies on.
POD_MOVES = [
    pytest.param(
        _pod(PS.SUBMITTED),
        pod.Observed(P.PENDING),
        _pod(PS.SUBMITTED),
        {PA.PUBLISH},
        id="no-workload-yet",
    ),
    pytest.param(
        _pod(PS.SUBMITTED),
        pod.Observed(P.QUEUED, workload=True),
        _pod(PS.QUEUED),
        {PA.PUBLISH},
        id="workload-seen",
    ),
    pytest.param(
        _pod(PS.QUEUED),
        pod.Observed(P.RUNNING, workload=True),
        _pod(PS.RAN),
        {PA.PUBLISH},
        id="head-ready",
    ),
    pytest.param(
        _pod(PS.SUBMITTED),
        pod.Observed(P.RUNNING, workload=True),
        _pod(PS.RAN),
        {PA.PUBLISH},
        id="ready-at-the-first-look",
    ),
    pytest.param(
        _pod(PS.RAN),
        pod.Observed(P.QUEUED, workload=True),
        _pod(PS.RAN),
        {PA.PUBLISH},
        id="requeued-still-ran",
    ),
    pytest.param(
        _pod(PS.QUEUED),
        pod.Observed(P.FAILED, workload=True),
        _pod(PS.FAILED),
        {PA.SAY_FAILURE},
        id="failed-start-said-with-its-logs",
    ),
    pytest.param(
        _pod(PS.FAILED),
        pod.Observed(P.FAILED, workload=True),
        _pod(PS.FAILED),
        set(),
        id="failure-said-once",
    ),
    pytest.param(
        _pod(PS.FAILED),
        pod.Observed(P.FINISHED, workload=True),
        _pod(PS.FAILED),
        {PA.PUBLISH},
        id="after-the-failure-other-statuses-published",
    ),
    pytest.param(
        _pod(PS.SUBMITTED),
        pod.Observed(P.FAILED, workload=True, never_fits=True),
        _pod(PS.QUEUED),
        {PA.PUBLISH},
        id="never-fits-said-at-once",
    ),
    pytest.param(
        _pod(),
        pod.Observed(P.QUEUED, workload=True, needs_replacement=True),
        _pod(replacing=True),
        {PA.REPLACE, PA.PUBLISH},
        id="evicted-pods-replaced",
    ),
    pytest.param(
        _pod(replacing=True),
        pod.Observed(P.QUEUED, workload=True, needs_replacement=True),
        _pod(replacing=True),
        {PA.PUBLISH},
        id="one-round-at-a-time",
    ),
    pytest.param(
        _pod(),
        pod.Observed(P.QUEUED, workload=True, needs_replacement=True, unlisted=True),
        _pod(),
        {PA.PUBLISH},
        id="no-round-before-the-last-is-listed",
    ),
    pytest.param(
        _pod(PS.QUEUED),
        pod.Observed(P.QUEUED, workload=True, needs_replacement=True),
        _pod(PS.QUEUED, replacing=True),
        {PA.REPLACE, PA.PUBLISH},
        id="evicted-before-it-ran",
    ),
    pytest.param(
        _pod(wake=True),
        pod.Observed(P.PARKED, workload=True),
        _pod(),
        {PA.WAKE, PA.PUBLISH},
        id="parked-woken-as-asked",
    ),
    pytest.param(
        _pod(wake=True),
        pod.Observed(P.PARKED, workload=True, needs_replacement=True),
        _pod(replacing=True, wake=True),
        {PA.REPLACE, PA.PUBLISH},
        id="parked-wake-waits-for-its-replacement",
    ),
    pytest.param(
        _pod(replacing=True, wake=True),
        pod.Observed(P.PARKED, workload=True),
        _pod(replacing=True, wake=True),
        {PA.PUBLISH},
        id="parked-wake-waits-for-the-round",
    ),
    pytest.param(
        _pod(wake=True),
        pod.Observed(P.PARKED, workload=True, unlisted=True),
        _pod(wake=True),
        {PA.PUBLISH},
        id="parked-wake-waits-for-the-listing",
    ),
    pytest.param(
        _pod(wake=True),
        pod.Observed(P.PARKING, workload=True),
        _pod(wake=True),
        {PA.PUBLISH},
        id="wake-waits-while-parking",
    ),
    pytest.param(_pod(), pod.Park(P.RUNNING), _pod(), {PA.DEACTIVATE}, id="park-a-running-group"),
    pytest.param(
        _pod(wake=True), pod.Park(P.RUNNING), _pod(), {PA.DEACTIVATE}, id="park-forgets-a-wake"
    ),
    pytest.param(_pod(), pod.Resume(P.PARKED), _pod(), {PA.WAKE}, id="resume-a-parked-group"),
    pytest.param(_pod(), pod.Resume(P.PARKING), _pod(wake=True), set(), id="resume-while-parking"),
    pytest.param(
        _pod(replacing=True),
        pod.Resume(P.PARKED),
        _pod(replacing=True, wake=True),
        set(),
        id="resume-while-replacing",
    ),
    pytest.param(
        _pod(),
        pod.Resume(P.PARKED, unlisted=True),
        _pod(wake=True),
        set(),
        id="resume-before-the-replacement-is-listed",
    ),
    pytest.param(
        _pod(replacing=True),
        pod.Resume(P.RUNNING),
        _pod(replacing=True, wake=True),
        set(),
        id="resume-while-replacing-a-running-group",
    ),
    pytest.param(_pod(replacing=True), D.REPLACED, _pod(), set(), id="round-made"),
    pytest.param(
        _pod(replacing=True, wake=True),
        D.REPLACED,
        _pod(wake=True),
        {PA.REFRESH},
        id="round-made-a-held-wake-goes-on",
    ),
    pytest.param(_pod(PS.SUBMITTED), pod.Adopt(ran=True), _pod(), set(), id="adopted"),
    pytest.param(_pod(), pod.Adopt(ran=False), _pod(PS.QUEUED), set(), id="adopted-not-ready"),
    pytest.param(_pod(PS.QUEUED), pod.Adopt(ran=True), _pod(), set(), id="adopted-parked"),
    pytest.param(_pod(PS.QUEUED), D.END, _pod(PS.ENDING), {PA.DELETE}, id="deletion-begins"),
    pytest.param(
        _pod(replacing=True, wake=True),
        D.END,
        _pod(PS.ENDING, replacing=True),
        {PA.DELETE},
        id="deletion-during-a-round",
    ),
    pytest.param(_pod(PS.FAILED), D.END, _pod(PS.ENDING), {PA.DELETE}, id="a-failed-group-deleted"),
    pytest.param(
        _pod(PS.ENDING, replacing=True),
        D.REPLACED,
        _pod(PS.ENDING),
        set(),
        id="round-ends-during-the-deletion",
    ),
    pytest.param(_pod(PS.ENDING), D.DELETED, _pod(PS.ENDED), set(), id="deleted"),
]


@pytest.mark.parametrize(("state", "event", "expected", "actions"), POD_MOVES)
def test_a_pod_group_moves(
    state: pod.State, event: pod.Event, expected: pod.State, actions: set[pod.Action]
) -> None:
    moved = pod.step(state, event)
    assert moved.state == expected
    assert moved.actions == actions


POD_IGNORED = [
    pytest.param(_pod(PS.ENDING), pod.Observed(P.QUEUED, workload=True), id="no-status-ending"),
    pytest.param(
        _pod(PS.ENDING),
        pod.Observed(P.QUEUED, workload=True, needs_replacement=True),
        id="no-replacement-ending",
    ),
    pytest.param(_pod(PS.ENDED), pod.Observed(P.RUNNING, workload=True), id="no-status-ended"),
    pytest.param(_pod(PS.ENDING), pod.Resume(P.PARKED), id="no-wake-ending"),
    pytest.param(_pod(PS.ENDING), pod.Park(P.RUNNING), id="no-park-ending"),
    pytest.param(_pod(PS.ENDING), D.END, id="deleted-once"),
    pytest.param(_pod(PS.ENDED), D.END, id="deleted-already"),
    pytest.param(_pod(PS.ENDING), pod.Adopt(ran=False), id="no-adoption-ending"),
    pytest.param(_pod(PS.FAILED), pod.Adopt(ran=True), id="a-failure-stays"),
    pytest.param(_pod(), D.DELETED, id="deleted-without-a-deletion"),
    pytest.param(_pod(), pod.Park(P.PARKING), id="park-while-parking"),
    pytest.param(_pod(), pod.Park(P.QUEUED), id="park-a-waiting-group"),
    pytest.param(_pod(wake=True), pod.Park(P.PARKED), id="park-a-parked-group-keeps-its-wake"),
    pytest.param(_pod(), pod.Resume(P.RUNNING), id="resume-a-running-group"),
    pytest.param(_pod(), pod.Resume(P.QUEUED), id="resume-a-waiting-group"),
    pytest.param(_pod(), D.REPLACED, id="round-end-without-a-round"),
]


@pytest.mark.parametrize(("state", "event"), POD_IGNORED)
def test_a_pod_group_ignores(state: pod.State, event: pod.Event) -> None:
    assert pod.step(state, event) == pod.Transition(state, frozenset())


@pytest.mark.parametrize(
    ("stage", "had_workload", "ran", "ending"),
    [
        (PS.SUBMITTED, False, False, False),
        (PS.QUEUED, True, False, False),
        (PS.RAN, True, True, False),
        (PS.FAILED, True, False, False),
        (PS.ENDING, False, False, True),
        (PS.ENDED, False, False, True),
    ],
)
def test_what_a_pod_group_stage_tells_its_status(
    stage: pod.Stage, had_workload: bool, ran: bool, ending: bool
) -> None:
    state = pod.State(stage)
    assert (state.had_workload, state.ran, state.ending) == (had_workload, ran, ending)


def test_a_resume_while_parking_and_replacing_wakes_once_parked_with_its_pods_listed() -> None:
    """The kubernetes park and wake race: woken only once parked, its replacement made and
    listed; a wake before then had Kueue admit the stopped pod alone ('the kernel ended')."""
    state = _pod()
    woke: list[str] = []
    for label, event in [
        ("park", pod.Park(P.RUNNING)),
        ("resume", pod.Resume(P.PARKING)),
        ("parking", pod.Observed(P.PARKING, workload=True)),
        ("stopped", pod.Observed(P.PARKED, workload=True, needs_replacement=True)),
        ("made", D.REPLACED),
        ("unlisted", pod.Observed(P.PARKED, workload=True, unlisted=True)),
        ("listed", pod.Observed(P.PARKED, workload=True)),
        ("again", pod.Observed(P.PARKED, workload=True)),
    ]:
        moved = pod.step(state, event)
        state = moved.state
        if PA.WAKE in moved.actions:
            woke.append(label)
    assert woke == ["listed"]


def test_the_server_looks_once_at_a_started_head_and_its_readiness_speaks_after() -> None:
    look = pod.HeadLook()
    assert look.reached == ""
    trying = look.start("a")
    assert trying is not None and trying.look is pod.Look.LOOKING
    assert trying.start("a") is None  # one try at a time
    reached = trying.answered("a")
    assert (reached.look, reached.reached) == (pod.Look.REACHED, "a")
    assert reached.start("a") is None and reached.ended("a") == reached  # the try is over
    ready = reached.seen_ready("a")
    assert (ready.reached, ready.start("a")) == ("", None)  # a restart in place: Ready speaks
    # a replacement head is another pod: looked at afresh
    replaced = ready.start("b")
    assert replaced is not None and replaced.uid == "b"
    # a try that ends without an answer may run again; an old pod's answer changes nothing
    assert replaced.ended("b").start("b") is not None
    assert replaced.answered("a") == replaced
