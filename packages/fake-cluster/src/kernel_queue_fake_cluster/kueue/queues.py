"""Queues for the fake Kueue: ClusterQueues as `admission.py` sees them, and what Kueue reports.

Maps a ClusterQueue's spec to `admission.ClusterQueue` and a Workload to `admission.Request`
(quantities as integers: cpu in millicores, everything else in base units), and builds Kueue's
reports: podSetAssignments, QuotaReserved=False messages, queue status counters and conditions,
and PendingWorkload items of the visibility API. Pure functions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kernel_queue import admission, quantities

from kernel_queue_fake_cluster.kueue import constants as k
from kernel_queue_fake_cluster.kueue import pods, releases
from kernel_queue_fake_cluster.kueue import workload as kw

Obj = dict[str, Any]
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def amount(resource: str, value: str | int | float) -> int:
    """A quantity as the engine counts it: cpu in millicores, the rest in base units."""
    return quantities.millicores(value) if resource == "cpu" else quantities.bytes_(value)


def quantity(resource: str, value: int) -> str:
    """The inverse of `amount`, in Kubernetes' usual spelling ("500m", "3", "36Gi")."""
    if resource == "cpu":
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for suffix, size in _BINARY:
            if value and value % size == 0:
                return f"{value // size}{suffix}"
    return str(value)


def pod_requests(spec: Obj) -> dict[str, int]:
    """One pod's requests: containers summed (a limit stands in for a missing request, as the
    apiserver defaults it), at least each init container, plus the pod overhead."""

    def requests(container: Obj) -> dict[str, int]:
        resources = container.get("resources") or {}
        found = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: amount(name, value) for name, value in found.items()}

    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, value in requests(container).items():
            total[name] = total.get(name, 0) + value
    for container in spec.get("initContainers") or []:
        for name, value in requests(container).items():
            total[name] = max(total.get(name, 0), value)
    for name, value in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, 0) + amount(name, value)
    return total


def pod_set_requests(pod_set: Obj) -> dict[str, int]:
    count = int(pod_set.get("count", 1))
    spec = (pod_set.get("template") or {}).get("spec") or {}
    return {name: value * count for name, value in pod_requests(spec).items()}


def workload_requests(wl: Obj) -> dict[str, int]:
    total: dict[str, int] = {}
    for pod_set in wl["spec"].get("podSets") or []:
        for name, value in pod_set_requests(pod_set).items():
            total[name] = total.get(name, 0) + value
    return total


def request(wl: Obj, created: float) -> admission.Request:
    """The engine's view of a Workload: named `<ns>/<name>`, queued in `<ns>/<LocalQueue>`."""
    meta, spec = wl["metadata"], wl["spec"]
    return admission.Request(
        name=f"{meta['namespace']}/{meta['name']}",
        queue=f"{meta['namespace']}/{spec.get('queueName', '')}",
        resources=workload_requests(wl),
        priority=int(spec.get("priority") or 0),
        created=created,
    )


def engine_queue(cq: Obj) -> admission.ClusterQueue:
    """`spec.resourceGroups` (nominal quotas), `queueingStrategy`, `preemption.withinClusterQueue`;
    cohorts, borrowing and lending limits are not modelled."""
    spec = cq.get("spec") or {}
    groups = tuple(
        admission.ResourceGroup(
            covered=frozenset(group.get("coveredResources") or []),
            flavors=tuple(
                admission.Flavor(
                    flavor["name"],
                    {r["name"]: amount(r["name"], r["nominalQuota"]) for r in flavor["resources"]},
                )
                for flavor in group.get("flavors") or []
            ),
        )
        for group in spec.get("resourceGroups") or []
    )
    return admission.ClusterQueue(
        name=cq["metadata"]["name"],
        resource_groups=groups,
        strategy=admission.QueueingStrategy(spec.get("queueingStrategy") or "BestEffortFIFO"),
        preemption=admission.PreemptionPolicy(
            (spec.get("preemption") or {}).get("withinClusterQueue") or "Never"
        ),
    )


def flavor_names(cq: Obj) -> list[str]:
    groups = (cq.get("spec") or {}).get("resourceGroups") or []
    return [flavor["name"] for group in groups for flavor in group.get("flavors") or []]


def stopped(queue: Obj | None) -> bool:
    return queue is not None and ((queue.get("spec") or {}).get("stopPolicy") or "None") != "None"


def cq_path(cq: Obj) -> str:
    """`buildCQPath` for a ClusterQueue in at most one (root) cohort."""
    cohort = (cq.get("spec") or {}).get("cohortName")
    return f"/{cohort}/{cq['metadata']['name']}" if cohort else f"/{cq['metadata']['name']}"


def assignments(wl: Obj, flavors: Mapping[str, str]) -> list[Obj]:
    """`status.admission.podSetAssignments` for the engine's resource → flavor choice."""
    found = []
    for pod_set in wl["spec"]["podSets"]:
        usage = {name: v for name, v in pod_set_requests(pod_set).items() if name in flavors}
        found.append(
            {
                "name": pod_set["name"],
                "flavors": {name: flavors[name] for name in sorted(usage)},
                "resourceUsage": {name: quantity(name, usage[name]) for name in sorted(usage)},
                "count": int(pod_set.get("count", 1)),
            }
        )
    return found


def admitted_flavors(wl: Obj) -> dict[str, str]:
    found: dict[str, str] = {}
    for assignment in ((wl.get("status") or {}).get("admission") or {}).get(
        "podSetAssignments", []
    ):
        found.update(assignment.get("flavors") or {})
    return found


def pending_message(
    wl: Obj,
    cq: admission.ClusterQueue,
    used: Mapping[tuple[str, str], int],
    unfit: admission.Unfit | None,
) -> tuple[str, str] | None:
    """Why a Workload is left pending (`releases.NO_FLAVOR`, `EXCEEDS` or `QUOTA`) and Kueue's
    "couldn't assign flavors to pod set …" (the same words from 0.14 to 0.20,
    `pkg/scheduler/flavorassigner`), or None when nothing is short (it waits behind a StrictFIFO
    head or a preemptor's reservation)."""
    pod_set = wl["spec"]["podSets"][0]["name"]
    if unfit is not None and unfit.largest == 0:
        why, detail = releases.NO_FLAVOR, f"resource {unfit.resource} unavailable in ClusterQueue"
    elif unfit is not None:
        flavor = max(
            (f for g in cq.resource_groups if unfit.resource in g.covered for f in g.flavors),
            key=lambda f: f.quota.get(unfit.resource, 0),
        )
        why, detail = (
            releases.EXCEEDS,
            (
                f"insufficient quota for {unfit.resource} in flavor {flavor.name}, previously "
                f"considered podsets requests (0) + current podset request "
                f"({quantity(unfit.resource, unfit.requested)}) > maximum capacity "
                f"({quantity(unfit.resource, unfit.largest)})"
            ),
        )
    elif (short := _first_shortage(workload_requests(wl), cq, used)) is not None:
        name, flavor_name, missing = short
        why = releases.QUOTA
        detail = f"insufficient unused quota for {name} in flavor {flavor_name}, "
        detail += f"{missing} more needed"
    else:
        return None
    return why, f"couldn't assign flavors to pod set {pod_set}: {detail}"


def _first_shortage(
    needs: Mapping[str, int], cq: admission.ClusterQueue, used: Mapping[tuple[str, str], int]
) -> tuple[str, str, str] | None:
    """(resource, flavor, amount missing) in the first flavor of each group, in name order."""
    for group in cq.resource_groups:
        if not group.flavors:
            continue
        first = group.flavors[0]
        for name in sorted(r for r in needs if r in group.covered and needs[r] > 0):
            free = first.quota.get(name, 0) - used.get((first.name, name), 0)
            if needs[name] > free:
                return name, first.name, quantity(name, needs[name] - free)
    return None


def usage_list(cq: Obj, used: Mapping[tuple[str, str], int], *, borrowed: bool) -> list[Obj]:
    """`flavorsUsage` / `flavorsReservation`: every flavor and covered resource of `cq`."""
    found = []
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            resources = []
            for name in group.get("coveredResources") or []:
                entry: Obj = {
                    "name": name,
                    "total": quantity(name, used.get((flavor["name"], name), 0)),
                }
                if borrowed:
                    entry["borrowed"] = "0"
                resources.append(entry)
            found.append({"name": flavor["name"], "resources": resources})
    return found


def queue_status(
    queue: Obj,
    workloads: Iterable[Obj],
    *,
    pending: int,
    cq: Obj | None,
    active: tuple[bool, str, str],
    request_of: Callable[[Obj], admission.Request] | None = None,
) -> Obj:
    """A ClusterQueue's or LocalQueue's status: counters, usage, the Active condition.

    `request_of` gives a Workload's engine request (the scheduler passes its cached one)."""
    reserving = [wl for wl in workloads if kw.has_reservation(wl)]
    of = request_of or (lambda wl: request(wl, 0.0))
    used = admission.usage(
        admission.Admitted(of(wl), admitted_flavors(wl), 0.0) for wl in reserving
    )
    status: Obj = {
        **copy.deepcopy(queue.get("status") or {}),
        "pendingWorkloads": pending,
        "reservingWorkloads": len(reserving),
        "admittedWorkloads": sum(1 for wl in reserving if kw.is_true(wl, k.ADMITTED)),
    }
    if cq is not None:
        is_cq = queue is cq
        status["flavorsReservation"] = usage_list(cq, used, borrowed=is_cq)
        status["flavorsUsage"] = usage_list(cq, used, borrowed=is_cq)
    copy_with_status = {"metadata": queue["metadata"], "status": status}
    kw.set_condition(copy_with_status, "Active", *active)
    result: Obj = copy_with_status["status"]
    return result


def pending_item(wl: Obj, in_cluster_queue: int, in_local_queue: int) -> Obj:
    """One `PendingWorkload` of the visibility API (`newPendingWorkload`)."""
    meta = wl["metadata"]
    item_meta: Obj = {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "creationTimestamp": meta.get("creationTimestamp"),
    }
    owners = [
        {key: ref[key] for key in ("apiVersion", "kind", "name", "uid") if key in ref}
        for ref in meta.get("ownerReferences") or []
    ]
    if owners:
        item_meta["ownerReferences"] = owners
    return {
        "metadata": item_meta,
        "priority": int(wl["spec"].get("priority") or 0),
        "localQueueName": wl["spec"].get("queueName", ""),
        "positionInClusterQueue": in_cluster_queue,
        "positionInLocalQueue": in_local_queue,
    }


def namespace_labels(namespace: Obj) -> dict[str, str]:
    return {k.NAMESPACE_NAME_LABEL: namespace["metadata"]["name"], **pods.labels_of(namespace)}
