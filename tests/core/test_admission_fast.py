"""Seeded random passes that would catch a shortcut in `admission.schedule` changing a decision.

A pass skips a request shape once one of its requests could neither fit nor preempt, and checks
each shape against the flavors once. These tests draw a few hundred queues (priorities, local
queues, both strategies, every policy, evicting workloads, unfit requests, many requests of the
same shape) and check what a user would notice: no flavor over its quota, victims only of lower
priority and only when the preemptor then fits, StrictFIFO's head-of-line blocking, a request
left waiting only when it did not fit, and positions counted 0..n-1 per queue in queue order.
"""

import random
from collections.abc import Iterable, Mapping

import pytest

from kernel_queue.admission import (
    Admitted,
    ClusterQueue,
    Decision,
    Flavor,
    Preemption,
    PreemptionPolicy,
    QueueingStrategy,
    Request,
    ResourceGroup,
    check_fits_ever,
    order,
    schedule,
    usage,
)

Cells = dict[tuple[str, str], int]
# Few shapes, so that many requests share one; the last two never fit.
SHAPES: tuple[dict[str, int], ...] = (
    {"gpu": 1},
    {"gpu": 1},
    {"gpu": 2},
    {"gpu": 4},
    {"gpu": 1, "cpu": 2, "memory": 8},
    {"gpu": 2, "cpu": 4, "memory": 32},
    {"cpu": 1},
    {"cpu": 8, "memory": 64},
    {"gpu": 0},
    {},
    {"gpu": 9},
    {"gpu": 1, "example.com/fpga": 1},
)
SEEDS = range(300)


def single_flavor_queue(rng: random.Random) -> ClusterQueue:
    gpu = ResourceGroup(frozenset({"gpu"}), (Flavor("a100", {"gpu": rng.choice([2, 4, 8])}),))
    host = ResourceGroup(frozenset({"cpu", "memory"}), (Flavor("host", {"cpu": 16, "memory": 64}),))
    return ClusterQueue(
        "local",
        (gpu, host),
        rng.choice(list(QueueingStrategy)),
        rng.choice(list(PreemptionPolicy)),
    )


def two_flavor_queue(rng: random.Random) -> ClusterQueue:
    gpu = ResourceGroup(
        frozenset({"gpu"}), (Flavor("a100", {"gpu": 2}), Flavor("t4", {"gpu": rng.choice([2, 4])}))
    )
    host = ResourceGroup(
        frozenset({"cpu", "memory"}),
        (Flavor("small", {"cpu": 4, "memory": 16}), Flavor("big", {"cpu": 16, "memory": 64})),
    )
    return ClusterQueue(
        "local",
        (gpu, host),
        rng.choice(list(QueueingStrategy)),
        rng.choice(list(PreemptionPolicy)),
    )


def nominal(cq: ClusterQueue) -> Cells:
    return {
        (flavor.name, r): flavor.quota.get(r, 0)
        for group in cq.resource_groups
        for flavor in group.flavors
        for r in group.covered
    }


def needs(request: Request) -> dict[str, int]:
    return {r: a for r, a in request.resources.items() if a > 0}


def draw(rng: random.Random, cq: ClusterQueue) -> tuple[list[Request], list[Admitted]]:
    """Pending requests and workloads admitted within quota, some of them evicting."""
    size = rng.randint(1, 40)
    names = [f"k{i:02d}" for i in range(size)]
    rng.shuffle(names)
    requests = [
        Request(
            name,
            rng.choice(["alice", "bob", "carol"]),
            dict(rng.choice(SHAPES)),
            rng.randint(-1, 3),
            float(rng.randint(0, 9)),
        )
        for name in names
    ]
    free = nominal(cq)
    admitted: list[Admitted] = []
    for request in requests[: rng.randint(0, size)]:
        flavors = first_fit(cq, request, free)
        if flavors is None:
            continue
        for r, a in needs(request).items():
            free[flavors[r], r] -= a
        at = float(rng.randint(0, 9))
        admitted.append(Admitted(request, flavors, at, evicting=rng.random() < 0.15))
    held = {w.request.name for w in admitted}
    return [r for r in requests if r.name not in held], admitted


def first_fit(cq: ClusterQueue, request: Request, free: Cells) -> dict[str, str] | None:
    flavors: dict[str, str] = {}
    for group in cq.resource_groups:
        wanted = {r: a for r, a in needs(request).items() if r in group.covered}
        if not wanted:
            continue
        chosen = next(
            (f.name for f in group.flavors if all(a <= free[f.name, r] for r, a in wanted.items())),
            None,
        )
        if chosen is None:
            return None
        flavors.update(dict.fromkeys(wanted, chosen))
    if any(r not in flavors for r in needs(request)):
        return None
    return flavors


def charged(requests: Iterable[Request], flavor_of: Mapping[str, str]) -> Cells:
    total: Cells = {}
    for request in requests:
        for r, a in needs(request).items():
            total[flavor_of[r], r] = total.get((flavor_of[r], r), 0) + a
    return total


def within(quota: Cells, *uses: Cells) -> bool:
    return all(sum(use.get(cell, 0) for use in uses) <= amount for cell, amount in quota.items())


def fits(quota: Cells, need: Cells, *uses: Cells) -> bool:
    """Whether `need` fits the quota left after `uses`, in the cells it needs (others may be
    over: a preemptor's reservation is charged before its victims leave)."""
    return all(a + sum(use.get(cell, 0) for use in uses) <= quota[cell] for cell, a in need.items())


def may_preempt(policy: PreemptionPolicy, preemptor: Request, victim: Request) -> bool:
    if policy is PreemptionPolicy.NEVER:
        return False
    newer_peer = victim.priority == preemptor.priority and victim.created > preemptor.created
    return victim.priority < preemptor.priority or (
        newer_peer and policy is PreemptionPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
    )


def check_common(
    cq: ClusterQueue, pending: list[Request], admitted: list[Admitted], decision: Decision
) -> None:
    """What holds for any flavors: quota, victims, FIFO blocking, unfit reports, positions."""
    queue = order(pending)
    by_name = {r.name: r for r in queue}
    held = {w.request.name: w for w in admitted}
    granted = {grant.name: grant for grant in decision.admit}
    fitting = [r for r in queue if check_fits_ever(cq, r) is None]
    assert list(decision.unfit) == [
        check_fits_ever(cq, r) for r in queue if check_fits_ever(cq, r) is not None
    ]
    assert [grant.name for grant in decision.admit] == [
        r.name for r in fitting if r.name in granted
    ]
    # Each admission takes one flavor of each group it needs, and the quota holds.
    for grant in decision.admit:
        request = by_name[grant.name]
        assert set(grant.flavors) == set(needs(request))
        for group in cq.resource_groups:
            chosen = {grant.flavors[r] for r in needs(request) if r in group.covered}
            assert len(chosen) <= 1
            assert chosen <= {f.name for f in group.flavors}
    newly = [Admitted(by_name[g.name], g.flavors, 0.0) for g in decision.admit]
    assert within(nominal(cq), usage(admitted), usage(newly))
    # Victims: held, not already leaving, of lower priority, each taken once, named last in
    # their preemptor's waiting_for.
    victims = [p.victim for p in decision.preempt]
    assert len(victims) == len(set(victims))
    for preemption in decision.preempt:
        victim, preemptor = held[preemption.victim], by_name[preemption.preemptor]
        assert preemption.reason == "InClusterQueue"
        assert not victim.evicting
        assert may_preempt(cq.preemption, preemptor, victim.request)
        assert preemption.victim in decision.waiting_for[preemption.preemptor]
    for name, claims in decision.waiting_for.items():
        new = [p.victim for p in decision.preempt if p.preemptor == name]
        assert claims[len(claims) - len(new) :] == tuple(new)
        assert all(held[other].evicting for other in claims[: len(claims) - len(new)])
        assert name not in granted
    claimed = [name for names in decision.waiting_for.values() for name in names]
    assert len(claimed) == len(set(claimed))
    # StrictFIFO: admitted up to the first request that does not fit; only it may preempt.
    if cq.strategy is QueueingStrategy.STRICT_FIFO:
        head = next((r.name for r in fitting if r.name not in granted), None)
        cut = [r.name for r in fitting].index(head) if head else len(fitting)
        assert set(granted) == {r.name for r in fitting[:cut]}
        assert set(decision.waiting_for) <= {head}
    # Positions: every request still pending, 0..n-1 in queue order, per local queue too.
    waiting = [r for r in queue if r.name not in granted]
    assert list(decision.positions) == [r.name for r in waiting]
    assert [p.in_cluster_queue for p in decision.positions.values()] == list(range(len(waiting)))
    for local in {r.queue for r in waiting}:
        mine = [decision.positions[r.name] for r in waiting if r.queue == local]
        assert [p.in_queue for p in mine] == list(range(len(mine)))
        assert {p.queue_length for p in mine} == {len(mine)}


def check_single_flavor(
    cq: ClusterQueue, pending: list[Request], admitted: list[Admitted], decision: Decision
) -> None:
    """With one flavor per group a request's cells are known: walk the queue and check each
    request was admitted, preempted for or left waiting exactly as the quota left allowed."""
    flavor_of = {r: group.flavors[0].name for group in cq.resource_groups for r in group.covered}
    quota = nominal(cq)
    granted = {grant.name for grant in decision.admit}
    held = {w.request.name: w for w in admitted}
    taken: set[str] = set()  # workloads some earlier preemptor counts on or evicts
    now = usage(admitted)  # what is charged: admitted, admissions and preemptors so far
    gone: Cells = {}  # what the claimed workloads free once they leave
    blocked = False
    for request in order(pending):
        if check_fits_ever(cq, request) is not None or blocked:
            continue
        mine = charged([request], flavor_of)
        if request.name in granted:
            assert fits(quota, mine, now), f"{request.name} admitted over quota"
            now = _add(now, mine)
            continue
        assert not fits(quota, mine, now), f"{request.name} fits but was left waiting"
        blocked = cq.strategy is QueueingStrategy.STRICT_FIFO
        removable = [
            w
            for name, w in held.items()
            if name not in taken and (w.evicting or may_preempt(cq.preemption, request, w.request))
        ]
        could = cq.preemption is not PreemptionPolicy.NEVER and fits(
            quota, mine, now, _neg(gone), _neg(usage(removable))
        )
        # A preemptor reserves its quota; it may need no one gone when an earlier preemptor's
        # victims free enough beyond that one's need (then it has no waiting_for entry).
        claims = decision.waiting_for.get(request.name, ())
        assert could or not claims, f"{request.name} cannot fit yet preempts {claims}"
        if not could:
            continue
        if not fits(quota, mine, now, _neg(gone)):
            assert claims, f"{request.name} could preempt but waits with nothing preempted"
        freed = usage(held[name] for name in claims)
        assert fits(quota, mine, now, _neg(gone), _neg(freed))
        for name in claims:  # minimal: without any one of them it would not fit
            rest = usage(held[other] for other in claims if other != name)
            assert not fits(quota, mine, now, _neg(gone), _neg(rest)), f"{name} not needed"
        taken.update(claims)
        gone = _add(gone, freed)
        now = _add(now, mine)


def _add(a: Cells, b: Cells) -> Cells:
    return {cell: a.get(cell, 0) + b.get(cell, 0) for cell in a.keys() | b.keys()}


def _neg(a: Cells) -> Cells:
    return {cell: -amount for cell, amount in a.items()}


@pytest.mark.parametrize("seed", SEEDS)
def test_random_pass_with_one_flavor_per_group_decides_as_the_quota_allows(seed: int) -> None:
    rng = random.Random(seed)
    cq = single_flavor_queue(rng)
    pending, admitted = draw(rng, cq)
    decision = schedule(cq, pending, admitted)
    check_common(cq, pending, admitted, decision)
    check_single_flavor(cq, pending, admitted, decision)
    shuffled = list(pending)
    rng.shuffle(shuffled)
    assert schedule(cq, shuffled, admitted) == decision


@pytest.mark.parametrize("seed", SEEDS)
def test_random_pass_with_two_flavors_per_group_keeps_quota_and_queue_rules(seed: int) -> None:
    rng = random.Random(10_000 + seed)
    cq = two_flavor_queue(rng)
    pending, admitted = draw(rng, cq)
    check_common(cq, pending, admitted, schedule(cq, pending, admitted))


ONE_GPU_GROUP = ResourceGroup(frozenset({"gpu", "cpu"}), (Flavor("a100", {"gpu": 4, "cpu": 8}),))


def test_a_thousand_waiting_kernels_of_one_shape_each_get_their_place() -> None:
    cq = ClusterQueue("local", (ONE_GPU_GROUP,), preemption=PreemptionPolicy.LOWER_PRIORITY)
    admitted = [
        Admitted(Request(f"run{i}", "lq", {"gpu": 1}), {"gpu": "a100"}, i) for i in range(4)
    ]
    pending = [Request(f"wait{i:04d}", "lq", {"gpu": 1}, 0, float(i)) for i in range(1000)]
    pending.append(Request("cpu-only", "lq", {"cpu": 1}, 0, 2000.0))
    pending.append(Request("urgent", "lq", {"gpu": 2}, 5, 3000.0))
    decision = schedule(cq, pending, admitted)
    assert [grant.name for grant in decision.admit] == ["cpu-only"]
    assert decision.waiting_for == {"urgent": ("run3", "run2")}
    assert list(decision.positions)[:3] == ["urgent", "wait0000", "wait0001"]
    assert decision.positions["wait0999"].in_queue == 1000
    assert {p.queue_length for p in decision.positions.values()} == {1001}


def test_each_unfit_request_of_one_shape_is_reported_under_its_own_name() -> None:
    cq = ClusterQueue("local", (ONE_GPU_GROUP,))
    pending = [Request(name, "lq", {"gpu": 5}, 0, float(i)) for i, name in enumerate("abc")]
    decision = schedule(cq, pending, [])
    assert [(u.name, u.message) for u in decision.unfit] == [
        (name, "requests 5 gpu but the largest flavor offers 4") for name in "abc"
    ]


def test_a_smaller_kernel_behind_ones_that_cannot_preempt_still_preempts() -> None:
    cq = ClusterQueue("local", (ONE_GPU_GROUP,), preemption=PreemptionPolicy.LOWER_PRIORITY)
    admitted = [
        Admitted(Request(f"vip{i}", "lq", {"gpu": 1}, 9), {"gpu": "a100"}, i) for i in range(3)
    ]
    admitted.append(Admitted(Request("low", "lq", {"gpu": 1}, 0), {"gpu": "a100"}, 5.0))
    pending = [
        Request("wide", "lq", {"gpu": 4}, 5, 1.0),
        Request("wide-too", "lq", {"gpu": 4}, 5, 2.0),
        Request("narrow", "lq", {"gpu": 1}, 5, 3.0),
    ]
    decision = schedule(cq, pending, admitted)
    assert decision.preempt == (Preemption("low", "narrow", "InClusterQueue"),)
    assert decision.waiting_for == {"narrow": ("low",)}
    assert list(decision.positions) == ["wide", "wide-too", "narrow"]
