"""Table-driven checks of the admission engine against Kueue's ClusterQueue behaviour."""

from collections.abc import Mapping

import pytest

from kernel_queue.admission import (
    Admission,
    Admitted,
    ClusterQueue,
    Decision,
    Flavor,
    Position,
    Preemption,
    PreemptionPolicy,
    QueueingStrategy,
    Request,
    ResourceGroup,
    Unfit,
    check_fits_ever,
    order,
    schedule,
    usage,
)

GPU = ResourceGroup(frozenset({"gpu"}), (Flavor("a100", {"gpu": 2}), Flavor("t4", {"gpu": 4})))
HOST = ResourceGroup(
    frozenset({"cpu", "memory"}),
    (Flavor("small", {"cpu": 4, "memory": 16}), Flavor("big", {"cpu": 16, "memory": 64})),
)
ONE_FLAVOR = ResourceGroup(frozenset({"gpu"}), (Flavor("a100", {"gpu": 4}),))

BEST = QueueingStrategy.BEST_EFFORT_FIFO
STRICT = QueueingStrategy.STRICT_FIFO
NEVER = PreemptionPolicy.NEVER
LOWER = PreemptionPolicy.LOWER_PRIORITY
NEWER_EQUAL = PreemptionPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
IN_CQ = "InClusterQueue"


def cq(
    *groups: ResourceGroup,
    strategy: QueueingStrategy = BEST,
    preemption: PreemptionPolicy = NEVER,
) -> ClusterQueue:
    return ClusterQueue("local", groups or (GPU,), strategy, preemption)


def req(
    name: str, created: float = 0.0, priority: int = 0, queue: str = "lq", **resources: int
) -> Request:
    return Request(name, queue, resources, priority, created)


def held(
    name: str,
    at: float,
    priority: int = 0,
    *,
    created: float = 0.0,
    flavor: str = "a100",
    evicting: bool = False,
    **resources: int,
) -> Admitted:
    flavors = dict.fromkeys(resources, flavor)
    return Admitted(Request(name, "lq", resources, priority, created), flavors, at, evicting)


def adm(name: str, **flavors: str) -> Admission:
    return Admission(name, flavors)


@pytest.mark.parametrize(
    ("queue", "pending", "admitted", "expected"),
    [
        pytest.param(
            cq(),
            [req("b", 2.0, gpu=1), req("a", 1.0, gpu=1)],
            [],
            (adm("a", gpu="a100"), adm("b", gpu="a100")),
            id="fitting-requests-admitted-in-queue-order",
        ),
        pytest.param(
            cq(),
            [req("a", gpu=1)],
            [held("old", 0.0, gpu=2)],
            (adm("a", gpu="t4"),),
            id="full-first-flavor-falls-through-to-second",
        ),
        pytest.param(
            cq(),
            [req("a", gpu=2)],
            [held("old", 0.0, gpu=1)],
            (adm("a", gpu="t4"),),
            id="one-flavor-per-group-never-split-across-flavors",
        ),
        pytest.param(
            cq(),
            [req("a", 1.0, gpu=2), req("b", 2.0, gpu=1)],
            [],
            (adm("a", gpu="a100"), adm("b", gpu="t4")),
            id="later-request-sees-quota-charged-earlier-in-the-call",
        ),
        pytest.param(
            cq(HOST),
            [req("a", cpu=2, memory=32)],
            [],
            (adm("a", cpu="big", memory="big"),),
            id="flavor-must-hold-every-resource-of-the-group",
        ),
        pytest.param(
            cq(GPU, HOST),
            [req("a", gpu=1, cpu=2, memory=4)],
            [held("old", 0.0, gpu=2)],
            (adm("a", gpu="t4", cpu="small", memory="small"),),
            id="each-resource-group-picks-its-own-flavor",
        ),
        pytest.param(
            cq(GPU, HOST),
            [req("a", gpu=0, cpu=1)],
            [held("old", 0.0, gpu=2), held("old2", 0.0, flavor="t4", gpu=4)],
            (adm("a", cpu="small"),),
            id="zero-amounts-are-ignored",
        ),
        pytest.param(
            cq(strategy=STRICT),
            [req("a", 1.0, gpu=4), req("z", 2.0)],
            [held("old", 0.0, gpu=2), held("old2", 0.0, flavor="t4", gpu=4)],
            (),
            id="zero-resource-request-still-waits-behind-strict-head",
        ),
        pytest.param(
            cq(),
            [req("z")],
            [held("old", 0.0, gpu=2), held("old2", 0.0, flavor="t4", gpu=4)],
            (adm("z"),),
            id="zero-resource-request-fits-a-full-queue",
        ),
        pytest.param(
            cq(),
            [req("a", gpu=1)],
            [held("e", 0.0, gpu=2, evicting=True), held("t", 0.0, flavor="t4", gpu=4)],
            (),
            id="evicting-workload-still-holds-its-quota",
        ),
        pytest.param(
            cq(ONE_FLAVOR),
            [req("early-low", 1.0, 0, gpu=4), req("late-high", 9.0, 5, gpu=4)],
            [],
            (adm("late-high", gpu="a100"),),
            id="priority-beats-arrival",
        ),
        pytest.param(
            cq(ONE_FLAVOR),
            [req("late", 2.0, gpu=4), req("early", 1.0, gpu=4)],
            [],
            (adm("early", gpu="a100"),),
            id="equal-priority-earlier-created-first",
        ),
        pytest.param(
            cq(ONE_FLAVOR),
            [req("b", 1.0, gpu=4), req("a", 1.0, gpu=4)],
            [],
            (adm("a", gpu="a100"),),
            id="equal-priority-and-created-by-name",
        ),
        pytest.param(
            cq(),
            [req("head", 1.0, gpu=4), req("small", 2.0, gpu=1)],
            [held("old", 0.0, flavor="t4", gpu=1)],
            (adm("small", gpu="a100"),),
            id="best-effort-fifo-skips-a-blocked-head",
        ),
        pytest.param(
            cq(strategy=STRICT),
            [req("head", 1.0, gpu=4), req("small", 2.0, gpu=1)],
            [held("old", 0.0, flavor="t4", gpu=1)],
            (),
            id="strict-fifo-blocks-behind-its-head",
        ),
        pytest.param(
            cq(strategy=STRICT),
            [req("a", 1.0, gpu=2), req("b", 2.0, gpu=4), req("c", 3.0, gpu=1)],
            [held("old", 0.0, flavor="t4", gpu=1)],
            (adm("a", gpu="a100"),),
            id="strict-fifo-admits-until-the-first-blocked-request",
        ),
        pytest.param(
            cq(strategy=STRICT),
            [req("huge", 1.0, gpu=8), req("a", 2.0, gpu=1)],
            [],
            (adm("a", gpu="a100"),),
            id="unfit-head-does-not-block-strict-fifo",
        ),
        pytest.param(cq(), [], [], (), id="nothing-pending"),
    ],
)
def test_schedule_admits(
    queue: ClusterQueue,
    pending: list[Request],
    admitted: list[Admitted],
    expected: tuple[Admission, ...],
) -> None:
    decision = schedule(queue, pending, admitted)
    assert decision.admit == expected
    assert decision.preempt == ()


@pytest.mark.parametrize(
    ("queue", "request_", "expected"),
    [
        pytest.param(
            cq(),
            req("big", gpu=5),
            Unfit("big", "gpu", 5, 4, "requests 5 gpu but the largest flavor offers 4"),
            id="larger-than-every-flavor",
        ),
        pytest.param(
            cq(),
            Request("fpga", "lq", {"gpu": 1, "example.com/fpga": 1}),
            Unfit(
                "fpga",
                "example.com/fpga",
                1,
                0,
                "requests 1 example.com/fpga, which no flavor of ClusterQueue 'local' covers",
            ),
            id="undeclared-resource-blocks",
        ),
        pytest.param(
            cq(),
            Request("fpga", "lq", {"gpu": 1, "example.com/fpga": 0}),
            None,
            id="undeclared-resource-with-zero-amount-fits",
        ),
        pytest.param(cq(), req("exact", gpu=4), None, id="largest-flavor-exactly-fits"),
        pytest.param(
            cq(
                ResourceGroup(
                    frozenset({"cpu", "memory"}),
                    (
                        Flavor("wide", {"cpu": 4, "memory": 64}),
                        Flavor("tall", {"cpu": 16, "memory": 32}),
                    ),
                )
            ),
            req("odd", cpu=8, memory=48),
            Unfit(
                "odd",
                "cpu",
                8,
                16,
                "requests 8 cpu, 48 memory, which no single flavor of ClusterQueue 'local' offers",
            ),
            id="no-single-flavor-offers-the-combination",
        ),
    ],
)
def test_check_fits_ever(queue: ClusterQueue, request_: Request, expected: Unfit | None) -> None:
    assert check_fits_ever(queue, request_) == expected


def test_unfit_requests_are_reported_with_positions_and_never_admitted() -> None:
    queue = cq(strategy=STRICT, preemption=LOWER)
    pending = [req("huge", 1.0, 9, gpu=5), req("a", 2.0, gpu=1)]
    decision = schedule(queue, pending, [held("low", 0.0, -1, gpu=2)])
    assert decision == Decision(
        admit=(adm("a", gpu="t4"),),
        preempt=(),
        unfit=(Unfit("huge", "gpu", 5, 4, "requests 5 gpu but the largest flavor offers 4"),),
        positions={"huge": Position(0, 0, 1)},
        waiting_for={},
    )


def test_positions_are_counted_after_this_passes_admissions() -> None:
    pending = [req("first", 1.0, gpu=4), req("second", 2.0, gpu=4), req("third", 3.0, gpu=4)]
    decision = schedule(cq(ONE_FLAVOR), pending, [])
    assert [a.name for a in decision.admit] == ["first"]
    assert decision.positions == {
        "second": Position(in_cluster_queue=0, in_queue=0, queue_length=2),
        "third": Position(in_cluster_queue=1, in_queue=1, queue_length=2),
    }


def test_positions_count_per_cluster_queue_and_per_local_queue() -> None:
    pending = [
        req("u1-late", 3.0, queue="user-1", gpu=4),
        req("u2", 2.0, queue="user-2", gpu=4),
        req("u1-early", 1.0, queue="user-1", gpu=4),
        req("vip", 9.0, 10, queue="user-2", gpu=4),
    ]
    decision = schedule(cq(ONE_FLAVOR), pending, [held("old", 0.0, gpu=4)])
    assert decision.positions == {
        "vip": Position(in_cluster_queue=0, in_queue=0, queue_length=2),
        "u1-early": Position(in_cluster_queue=1, in_queue=0, queue_length=2),
        "u2": Position(in_cluster_queue=2, in_queue=1, queue_length=2),
        "u1-late": Position(in_cluster_queue=3, in_queue=1, queue_length=2),
    }


def p(victim: str, preemptor: str) -> Preemption:
    return Preemption(victim, preemptor, IN_CQ)


@pytest.mark.parametrize(
    ("queue", "pending", "admitted", "admit", "preempt", "waiting_for"),
    [
        pytest.param(
            cq(ONE_FLAVOR),
            [req("high", 5.0, 10, gpu=2)],
            [held("low", 1.0, 0, gpu=4)],
            (),
            (),
            {},
            id="never-policy-waits",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("high", 5.0, 10, gpu=1)],
            [held("mid", 1.0, 5, gpu=2), held("low", 2.0, 1, gpu=2)],
            (),
            (p("low", "high"),),
            {"high": ("low",)},
            id="lower-priority-takes-lowest-priority-first",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("high", 5.0, 10, gpu=1)],
            [held("first", 1.0, gpu=2), held("last", 3.0, gpu=1), held("middle", 2.0, gpu=1)],
            (),
            (p("last", "high"),),
            {"high": ("last",)},
            id="lower-priority-takes-most-recently-admitted-first",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("high", 5.0, 10, gpu=3)],
            [held("a", 1.0, gpu=1), held("b", 2.0, gpu=1), held("c", 3.0, gpu=2)],
            (),
            (p("c", "high"), p("b", "high")),
            {"high": ("c", "b")},
            id="lower-priority-takes-victims-until-it-fits",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("high", 5.0, 10, gpu=3)],
            [held("small", 1.0, 0, gpu=1), held("big", 2.0, 1, gpu=3)],
            (),
            (p("big", "high"),),
            {"high": ("big",)},
            id="minimal-set-prunes-a-victim-greedy-took-first",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("peer", 5.0, gpu=2)],
            [held("newer", 1.0, created=9.0, gpu=4)],
            (),
            (),
            {},
            id="lower-priority-spares-newer-equal-priority",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=NEWER_EQUAL),
            [req("peer", 5.0, gpu=2)],
            [held("newer", 1.0, created=9.0, gpu=4)],
            (),
            (p("newer", "peer"),),
            {"peer": ("newer",)},
            id="lower-or-newer-equal-takes-newer-equal-priority",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=NEWER_EQUAL),
            [req("peer", 5.0, gpu=2)],
            [held("older", 1.0, created=4.0, gpu=4)],
            (),
            (),
            {},
            id="lower-or-newer-equal-spares-older-equal-priority",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("high", 5.0, 10, gpu=2)],
            [held("going", 1.0, 0, gpu=2, evicting=True), held("low", 2.0, 0, gpu=2)],
            (),
            (),
            {"high": ("going",)},
            id="evicting-workload-suffices-so-no-new-victim",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("high", 5.0, 10, gpu=3)],
            [
                held("going", 1.0, 20, gpu=1, evicting=True),
                held("low", 2.0, 0, gpu=2),
                held("busy", 3.0, 20, gpu=1),
            ],
            (),
            (p("low", "high"),),
            {"high": ("going", "low")},
            id="evicting-counted-then-new-victims-for-the-rest",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("h1", 1.0, 10, gpu=2), req("h2", 2.0, 10, gpu=2)],
            [held("v1", 1.0, gpu=2), held("v2", 2.0, gpu=2)],
            (),
            (p("v2", "h1"), p("v1", "h2")),
            {"h1": ("v2",), "h2": ("v1",)},
            id="two-preemptors-do-not-share-victims",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("h1", 1.0, 10, gpu=1), req("h2", 2.0, 10, gpu=2)],
            [held("going", 1.0, gpu=2, evicting=True), held("v", 2.0, gpu=2)],
            (),
            (p("v", "h2"),),
            {"h1": ("going",), "h2": ("v",)},
            id="evicting-workload-counted-by-one-preemptor-only",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("high", 1.0, 10, gpu=2), req("later", 2.0, 0, gpu=1)],
            [held("v", 1.0, -1, gpu=3)],
            (),
            (p("v", "high"),),
            {"high": ("v",)},
            id="preemptor-quota-not-given-to-a-lower-request",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("high", 1.0, 10, gpu=1), req("later", 2.0, 0, gpu=1)],
            [held("v", 1.0, -1, gpu=4)],
            (),
            (p("v", "high"),),
            {"high": ("v",)},
            id="victim-quota-reserved-for-its-preemptor",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("h1", 1.0, 10, gpu=2), req("h2", 2.0, 10, gpu=2), req("low", 3.0, gpu=1)],
            [held("v", 1.0, -1, gpu=4)],
            (),
            (p("v", "h1"),),
            {"h1": ("v",)},
            id="second-preemptor-plans-on-what-the-first-victim-frees-beyond-need",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("high", 1.0, 10, gpu=3), req("low", 2.0, 0, gpu=1)],
            [held("big", 1.0, 20, gpu=3)],
            (adm("low", gpu="a100"),),
            (),
            {},
            id="hopeless-preemptor-reserves-nothing-under-best-effort",
        ),
        pytest.param(
            cq(preemption=LOWER),
            [req("high", 5.0, 10, gpu=1)],
            [held("top", 1.0, 20, gpu=2), held("low", 2.0, 0, flavor="t4", gpu=4)],
            (),
            (p("low", "high"),),
            {"high": ("low",)},
            id="preempts-in-the-first-flavor-where-victims-make-room",
        ),
        pytest.param(
            cq(preemption=LOWER),
            [req("high", 5.0, 10, gpu=1)],
            [held("low", 1.0, 0, gpu=2)],
            (adm("high", gpu="t4"),),
            (),
            {},
            id="free-later-flavor-beats-preempting-in-the-first",
        ),
        pytest.param(
            cq(GPU, HOST, preemption=LOWER),
            [req("high", 5.0, 10, gpu=1, cpu=4)],
            [
                held("gpu-low", 1.0, 0, gpu=2),
                held("t4-low", 2.0, 0, flavor="t4", gpu=4),
                held("host-low", 3.0, 0, flavor="small", cpu=1),
            ],
            (),
            (p("gpu-low", "high"),),
            {"high": ("gpu-low",)},
            id="victims-only-where-a-group-lacks-quota",
        ),
        pytest.param(
            cq(ONE_FLAVOR, strategy=STRICT, preemption=LOWER),
            [req("head", 1.0, 10, gpu=2), req("tiny", 2.0, 10)],
            [held("v", 1.0, gpu=3)],
            (),
            (p("v", "head"),),
            {"head": ("v",)},
            id="strict-fifo-head-preempts-and-blocks-the-rest",
        ),
        pytest.param(
            cq(ONE_FLAVOR, preemption=LOWER),
            [req("huge", 1.0, 10, gpu=5)],
            [held("v", 1.0, gpu=4)],
            (),
            (),
            {},
            id="unfit-request-never-preempts",
        ),
    ],
)
def test_schedule_preempts(
    queue: ClusterQueue,
    pending: list[Request],
    admitted: list[Admitted],
    admit: tuple[Admission, ...],
    preempt: tuple[Preemption, ...],
    waiting_for: Mapping[str, tuple[str, ...]],
) -> None:
    decision = schedule(queue, pending, admitted)
    assert (decision.admit, decision.preempt, decision.waiting_for) == (
        admit,
        preempt,
        waiting_for,
    )


def test_order_is_priority_then_created_then_name() -> None:
    pending = [req("c", 1.0), req("b", 1.0), req("old", 0.5), req("vip", 7.0, 3)]
    assert [r.name for r in order(pending)] == ["vip", "old", "b", "c"]


def test_usage_sums_per_flavor_and_resource_including_evicting() -> None:
    admitted = [
        held("a", 0.0, gpu=1, cpu=2),
        held("b", 0.0, gpu=1, evicting=True),
        held("c", 0.0, flavor="t4", gpu=3, cpu=0),
    ]
    assert usage(admitted) == {("a100", "gpu"): 2, ("a100", "cpu"): 2, ("t4", "gpu"): 3}


def test_duplicate_pending_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unique names"):
        schedule(cq(), [req("a"), req("a", 1.0)], [])
