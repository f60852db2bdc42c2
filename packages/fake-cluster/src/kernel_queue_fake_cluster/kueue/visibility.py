"""Kueue's visibility API on the fake API server: the pending workloads of a LocalQueue or a
ClusterQueue, in queue order, paged as Kueue pages them.

Real Kueue serves `visibility.kueue.x-k8s.io` from an API server of its own, aggregated into the
cluster's: `v1beta1` up to 0.19, `v1beta2` from 0.15, the same body at both. Here `serve` adds
the two `pendingworkloads` routes of each version it is given (the cluster's release's, see
`releases.py`, or `VERSIONS` when a test sets it) and their discovery entries to the fake API
server, answered from the fake Kueue's queue order. `summary` is the body both the
routes and `FakeKueue.pending_workloads_for_*` give.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from kernel_queue_fake_cluster.apiserver import discovery
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.server import Request, Server

VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
BOTH = ("v1beta2", "v1beta1")
VERSIONS: tuple[str, ...] | None = None
"""A test's override: when set, the versions every fake cluster started from then on serves,
whatever its release (read at each start)."""
LOCAL_QUEUE_PENDING = (
    r"/apis/visibility\.kueue\.x-k8s\.io/(?P<version>{versions})/namespaces/(?P<namespace>[^/]+)"
    r"/localqueues/(?P<name>[^/]+)/pendingworkloads"
)
CLUSTER_QUEUE_PENDING = (
    r"/apis/visibility\.kueue\.x-k8s\.io/(?P<version>{versions})/clusterqueues/(?P<name>[^/]+)"
    r"/pendingworkloads"
)
MAX_LIMIT = 100_000
"""The most items one page holds (Kueue's `boundedLimitOffset`)."""

LocalQueuePending = Callable[[str, str], Sequence[Obj] | None]
"""`(namespace, local_queue)` → PendingWorkload items in queue order, or None (404)."""
ClusterQueuePending = Callable[[str], Sequence[Obj] | None]
"""`(cluster_queue)` → PendingWorkload items in queue order, or None (404)."""


def summary(
    items: Sequence[Obj] | None,
    kind: str,
    name: str,
    *,
    limit: int = 1000,
    offset: int = 0,
    version: str = "v1beta2",
) -> Obj:
    """A `PendingWorkloadsSummary` page of `items` at `version`; 404 for the `kind`
    ("localqueue" or "clusterqueue") named `name` when `items` is None (no such queue)."""
    if items is None:
        details = {"name": name, "group": VISIBILITY_GROUP, "kind": kind}
        raise ApiError(404, "NotFound", f'{kind}.{VISIBILITY_GROUP} "{name}" not found', details)
    offset, limit = max(offset, 0), min(max(limit, 0), MAX_LIMIT)
    return {
        "kind": "PendingWorkloadsSummary",
        "apiVersion": f"{VISIBILITY_GROUP}/{version}",
        "metadata": {},
        "items": list(items[offset : offset + limit]),
    }


def serve(
    server: Server,
    local_queue: LocalQueuePending,
    cluster_queue: ClusterQueuePending,
    versions: Sequence[str] = BOTH,
) -> None:
    """Serve the `pendingworkloads` of LocalQueues and ClusterQueues at each of `versions`
    on `server` from two providers of PendingWorkload items in queue order; the query's
    `offset` and `limit` page them (no `limit`, or 0: 1000 items)."""
    served = tuple(versions)
    alternatives = "|".join(re.escape(version) for version in served)

    def page(request: Request, items: Sequence[Obj] | None, kind: str, name: str) -> Obj:
        limit = discovery.number(request.query, "limit") or 1000
        offset = discovery.number(request.query, "offset") or 0
        version = request.params["version"]
        return summary(items, kind, name, limit=limit, offset=offset, version=version)

    def by_local_queue(request: Request) -> Obj:
        namespace, name = request.params["namespace"], request.params["name"]
        return page(request, local_queue(namespace, name), "localqueue", name)

    def by_cluster_queue(request: Request) -> Obj:
        name = request.params["name"]
        return page(request, cluster_queue(name), "clusterqueue", name)

    if not served:
        return
    server.add_route("GET", LOCAL_QUEUE_PENDING.format(versions=alternatives), by_local_queue)
    server.add_route("GET", CLUSTER_QUEUE_PENDING.format(versions=alternatives), by_cluster_queue)
    for version in served:
        for plural, kind, namespaced in (
            ("clusterqueues", "ClusterQueue", False),
            ("localqueues", "LocalQueue", True),
        ):
            entry = {"name": plural, "kind": kind, "namespaced": namespaced, "verbs": []}
            server.add_api_resource(VISIBILITY_GROUP, version, entry)
            pending: Obj = {"name": f"{plural}/pendingworkloads", "namespaced": namespaced}
            pending |= {"kind": "PendingWorkloadsSummary", "verbs": ["get"]}
            server.add_api_resource(VISIBILITY_GROUP, version, pending)
