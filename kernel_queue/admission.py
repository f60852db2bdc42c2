"""Admission decisions for one ClusterQueue: quota, queue order, flavors and preemption (Kueue).

This module owns the rules; callers own the state. The local backend and the fake Kueue
controller pass in the queue, the pending requests and the admitted workloads and apply the
returned Decision. It does no I/O, reads no clock, logs nothing and knows no backend.

Rules, as Kueue's ClusterQueue: pending requests are ordered by priority (high first), then
`created`, then name. Each resource group gives a request one flavor, the first in order where
it fits in free quota (nominal minus everything admitted, evicting workloads included). A
resource no group covers (BlockUndeclared) or more than any flavor offers makes a request unfit:
it keeps its position but is never admitted, never preempts and never blocks. StrictFIFO stops
admitting at the first request that cannot be admitted; BestEffortFIFO goes on. Under a
withinClusterQueue policy other than Never, a blocked request counts on evicting workloads,
then picks victims lowest priority first, most recently admitted first, and prunes them to a
minimal set. Its victims and its quota are reserved: later requests in the call are not
admitted into them, though later preemptors may plan on what its victims free beyond its need.
"""

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# (flavor name, resource name): the unit that quota and usage are counted in.
_Cell = tuple[str, str]
# A request's resources as (name, amount) pairs in its own order: what a pass decides on.
_Shape = tuple[tuple[str, int], ...]


class QueueingStrategy(enum.StrEnum):
    BEST_EFFORT_FIFO = "BestEffortFIFO"
    STRICT_FIFO = "StrictFIFO"


class PreemptionPolicy(enum.StrEnum):
    """Kueue's `preemption.withinClusterQueue`."""

    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"


@dataclass(frozen=True)
class Flavor:
    """One ResourceFlavor's nominal quota inside a resource group (integer units)."""

    name: str
    quota: Mapping[str, int]


@dataclass(frozen=True)
class ResourceGroup:
    """Kueue's `resourceGroups[]`: the covered resources and the flavors tried in order."""

    covered: frozenset[str]
    flavors: tuple[Flavor, ...]


@dataclass(frozen=True)
class ClusterQueue:
    name: str
    resource_groups: tuple[ResourceGroup, ...]
    strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    preemption: PreemptionPolicy = PreemptionPolicy.NEVER


@dataclass(frozen=True)
class Request:
    """A workload asking for quota; `name` is unique, amounts of 0 or less are ignored."""

    name: str
    queue: str
    resources: Mapping[str, int]
    priority: int = 0
    created: float = 0.0


@dataclass(frozen=True)
class Admitted:
    """A workload holding quota; an evicting one holds it until the caller removes it."""

    request: Request
    flavors: Mapping[str, str]
    admitted_at: float
    evicting: bool = False


@dataclass(frozen=True)
class Position:
    """0-based places among pending requests, as Kueue's visibility API reports them."""

    in_cluster_queue: int
    in_queue: int
    queue_length: int


@dataclass(frozen=True)
class Admission:
    name: str
    flavors: Mapping[str, str]


@dataclass(frozen=True)
class Preemption:
    """Evict `victim` so `preemptor` fits; `reason` is Kueue's, always "InClusterQueue" here."""

    victim: str
    preemptor: str
    reason: str


@dataclass(frozen=True)
class Unfit:
    """A request that can never fit; `largest` is 0 when no group covers `resource`."""

    name: str
    resource: str
    requested: int
    largest: int
    message: str


@dataclass(frozen=True)
class Decision:
    """One pass's outcome. `positions` covers every request still pending after `admit`, unfit
    ones included;
    `waiting_for` maps a preemptor to the evicting workloads it counts on, then its new victims.
    """

    admit: tuple[Admission, ...]
    preempt: tuple[Preemption, ...]
    unfit: tuple[Unfit, ...]
    positions: Mapping[str, Position]
    waiting_for: Mapping[str, tuple[str, ...]]


def order(pending: Iterable[Request]) -> list[Request]:
    """Return `pending` in Kueue's queue order: priority descending, created, then name.

    `schedule` and callers showing queue positions use it; the order is total for unique names.
    """
    return sorted(pending, key=lambda request: (-request.priority, request.created, request.name))


def usage(admitted: Iterable[Admitted]) -> dict[tuple[str, str], int]:
    """Sum the quota held by `admitted` per (flavor, resource).

    `schedule` uses it and callers report it as flavor usage. Only resources with an amount
    above 0 and a flavor in `Admitted.flavors` are charged.
    """
    total: dict[_Cell, int] = {}
    for workload in admitted:
        for resource, amount in workload.request.resources.items():
            flavor = workload.flavors.get(resource)
            if amount > 0 and flavor is not None:
                total[flavor, resource] = total.get((flavor, resource), 0) + amount
    return total


def check_fits_ever(cq: ClusterQueue, request: Request) -> Unfit | None:
    """Say why `request` can never fit `cq`, even with nothing admitted, or return None.

    `schedule` calls it per pending request; callers may call it on submission to refuse early.
    Resources are checked in name order, so the reported resource is deterministic.
    """
    needs = _needs(request)
    groups = {resource: group for group in cq.resource_groups for resource in group.covered}
    for resource, amount in sorted(needs.items()):
        group = groups.get(resource)
        if group is None:
            message = (
                f"requests {amount} {resource}, which no flavor of ClusterQueue {cq.name!r} covers"
            )
            return Unfit(request.name, resource, amount, 0, message)
        largest = _largest(group, resource)
        if amount > largest:
            message = f"requests {amount} {resource} but the largest flavor offers {largest}"
            return Unfit(request.name, resource, amount, largest, message)
    for group in cq.resource_groups:
        wanted = {r: a for r, a in sorted(needs.items()) if r in group.covered}
        if wanted and not any(
            all(a <= flavor.quota.get(r, 0) for r, a in wanted.items()) for flavor in group.flavors
        ):
            # Each resource fits some flavor, but no one flavor holds them all together.
            resource = next(
                r for r in wanted if any(wanted[r] > f.quota.get(r, 0) for f in group.flavors)
            )
            listed = ", ".join(f"{a} {r}" for r, a in wanted.items())
            message = (
                f"requests {listed}, which no single flavor of ClusterQueue {cq.name!r} offers"
            )
            return Unfit(
                request.name, resource, wanted[resource], _largest(group, resource), message
            )
    return None


def schedule(
    cq: ClusterQueue, pending: Sequence[Request], admitted: Sequence[Admitted]
) -> Decision:
    """Decide one admission pass of `cq` over `pending`, given the workloads in `admitted`.

    The local backend and the fake Kueue controller call it whenever the queue or the quota
    changes and apply the result: admit, evict the victims, report unfit requests and positions.
    Tuples follow processing order; the same inputs always give the same Decision. A pending
    request that is also in `admitted` is the caller's bug. Raises ValueError on duplicate names.
    """
    queue = order(pending)
    if len({request.name for request in queue}) != len(queue):
        raise ValueError("pending requests must have unique names")
    state = _Quota(cq, admitted)
    could_fit: set[_Shape] = set()  # shapes check_fits_ever passed
    admit: list[Admission] = []
    preempt: list[Preemption] = []
    unfit: list[Unfit] = []
    waiting_for: dict[str, tuple[str, ...]] = {}
    blocked = False
    for request in queue:
        shape = tuple(request.resources.items())
        if shape not in could_fit:
            misfit = check_fits_ever(cq, request)
            if misfit is not None:
                unfit.append(misfit)
                continue
            could_fit.add(shape)
        if blocked or shape in state.hopeless:
            continue
        flavors = state.fitting_flavors(request)
        if flavors is not None:
            state.charge(request, flavors, [])
            admit.append(Admission(request.name, flavors))
            continue
        blocked = cq.strategy is QueueingStrategy.STRICT_FIFO
        plan = None
        if cq.preemption is not PreemptionPolicy.NEVER:
            plan = state.plan_preemption(request, cq.preemption)
        if plan is None:
            state.hopeless.add(shape)
            continue
        flavors, victims, evicting = plan
        # Reserve: later requests may not be admitted into its quota nor into its victims'.
        state.charge(request, flavors, evicting + victims)
        names = [w.request.name for w in victims]
        preempt.extend(Preemption(victim, request.name, "InClusterQueue") for victim in names)
        if evicting or victims:
            waiting_for[request.name] = (*(w.request.name for w in evicting), *names)
    admitted_now = {grant.name for grant in admit}
    still_pending = [request for request in queue if request.name not in admitted_now]
    return Decision(
        tuple(admit), tuple(preempt), tuple(unfit), _positions(still_pending), waiting_for
    )


def _needs(request: Request) -> dict[str, int]:
    return {resource: amount for resource, amount in request.resources.items() if amount > 0}


def _largest(group: ResourceGroup, resource: str) -> int:
    return max((flavor.quota.get(resource, 0) for flavor in group.flavors), default=0)


def _positions(queue: list[Request]) -> dict[str, Position]:
    lengths: dict[str, int] = {}
    for request in queue:
        lengths[request.queue] = lengths.get(request.queue, 0) + 1
    seen: dict[str, int] = {}
    positions: dict[str, Position] = {}
    for index, request in enumerate(queue):
        in_queue = seen.get(request.queue, 0)
        seen[request.queue] = in_queue + 1
        positions[request.name] = Position(index, in_queue, lengths[request.queue])
    return positions


def _victim_order(workload: Admitted) -> tuple[int, float, str]:
    # Kueue's classic order: lowest priority first, then the most recently admitted.
    return (workload.request.priority, -workload.admitted_at, workload.request.name)


class _Quota:
    """Quota bookkeeping for one `schedule` call.

    `now` is what may be admitted at once: nominal minus everything admitted, admissions made
    and needs of preemptors seen in this call. `later` is the same once the workloads claimed
    by those preemptors (victims, counted-on evicting ones) are gone; only preemptors plan on it.
    """

    def __init__(self, cq: ClusterQueue, admitted: Sequence[Admitted]) -> None:
        self.groups = cq.resource_groups
        used = usage(admitted)
        self.now: dict[_Cell, int] = {
            (flavor.name, r): flavor.quota.get(r, 0) - used.get((flavor.name, r), 0)
            for group in cq.resource_groups
            for flavor in group.flavors
            for r in group.covered
        }
        self.later = dict(self.now)
        self.workloads = sorted(admitted, key=_victim_order)
        self.claimed: set[str] = set()
        # Shapes that can neither fit nor preempt for the rest of the call. A plan fails only if
        # no flavor fits once all its candidates are gone; a later request's candidates are
        # among them (queue order), and a charge frees in `later` only what it claims of them.
        self.hopeless: set[_Shape] = set()

    def fitting_flavors(self, request: Request) -> dict[str, str] | None:
        """Return the first flavor per group where `request` fits now, or None."""
        return self._assign(request, None)

    def charge(self, request: Request, flavors: Mapping[str, str], claims: list[Admitted]) -> None:
        """Charge `request` to `flavors`; `claims` are the workloads it counts on to leave."""
        for resource, amount in _needs(request).items():
            self.now[flavors[resource], resource] -= amount
            self.later[flavors[resource], resource] -= amount
        for cell, amount in usage(claims).items():
            self.later[cell] = self.later.get(cell, 0) + amount
        self.claimed.update(w.request.name for w in claims)

    def plan_preemption(
        self, request: Request, policy: PreemptionPolicy
    ) -> tuple[dict[str, str], list[Admitted], list[Admitted]] | None:
        """Return (flavors, new victims, evicting workloads counted on), or None if hopeless."""
        unclaimed = [w for w in self.workloads if w.request.name not in self.claimed]
        evicting = [w for w in unclaimed if w.evicting]
        candidates = [w for w in unclaimed if not w.evicting and _may_preempt(policy, request, w)]
        flavors = self._assign(request, evicting + candidates)
        if flavors is None:
            return None
        need = {(flavors[r], r): amount for r, amount in _needs(request).items()}
        short = [cell for cell, amount in need.items() if amount > self.later[cell]]
        # Evicting workloads leave anyway: count on them all, pick victims for the rest only.
        evicting = [w for w in evicting if _holds_any(w, short)]
        still_short = [cell for cell in short if not self._fits({cell: need[cell]}, evicting)]
        candidates = [w for w in candidates if _holds_any(w, still_short)]
        victims = self._minimal(candidates, need, evicting)
        if victims is None:
            return None
        return flavors, victims, self._minimal(evicting, need, victims) or []

    def _assign(self, request: Request, removable: list[Admitted] | None) -> dict[str, str] | None:
        # Per group: the first flavor that fits now, else the first that fits once removable go.
        flavors: dict[str, str] = {}
        for group in self.groups:
            wanted = {r: a for r, a in _needs(request).items() if r in group.covered}
            if not wanted:
                continue
            tries: list[tuple[Flavor, list[Admitted] | None]] = [(f, None) for f in group.flavors]
            if removable is not None:
                tries += [(flavor, removable) for flavor in group.flavors]
            chosen = next(
                (
                    flavor.name
                    for flavor, gone in tries
                    if self._fits({(flavor.name, r): a for r, a in wanted.items()}, gone)
                ),
                None,
            )
            if chosen is None:
                return None
            flavors.update(dict.fromkeys(wanted, chosen))
        return flavors

    def _fits(self, need: Mapping[_Cell, int], gone: list[Admitted] | None) -> bool:
        # None: against quota free now; a list: against `later` once `gone` have left too.
        if gone is None:
            return all(amount <= self.now.get(c, 0) for c, amount in need.items())
        freed = usage(gone)
        return all(amount <= self.later.get(c, 0) + freed.get(c, 0) for c, amount in need.items())

    def _minimal(
        self, candidates: list[Admitted], need: Mapping[_Cell, int], gone: list[Admitted]
    ) -> list[Admitted] | None:
        # Greedy in victim order until it fits, then Kueue's pruning: walk back from the last
        # pick and drop every workload the fit does not need.
        chosen: list[Admitted] = []
        for workload in candidates:
            if self._fits(need, gone + chosen):
                break
            chosen.append(workload)
        if not self._fits(need, gone + chosen):
            return None
        for workload in reversed(list(chosen)):
            trial = [w for w in chosen if w is not workload]
            if self._fits(need, gone + trial):
                chosen = trial
        return chosen


def _may_preempt(policy: PreemptionPolicy, preemptor: Request, workload: Admitted) -> bool:
    victim = workload.request
    newer_peer = victim.priority == preemptor.priority and victim.created > preemptor.created
    return victim.priority < preemptor.priority or (
        newer_peer and policy is PreemptionPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
    )


def _holds_any(workload: Admitted, cells: Iterable[_Cell]) -> bool:
    return any(
        workload.flavors.get(r) == f and workload.request.resources.get(r, 0) > 0 for f, r in cells
    )
