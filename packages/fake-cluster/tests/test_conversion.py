"""Kueue's kinds between v1beta1 and v1beta2: the fake's conversion webhook (`kueue/conversion.py`)
as a table of literals valid in both CRDs, a round trip, and a 0.19 cluster serving both: stored
at v1beta2, read, written, patched, validated and watched at the version a request names."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kernel_queue_fake_cluster.apiserver import crds as crd_files
from kernel_queue_fake_cluster.apiserver import schema as openapi
from kernel_queue_fake_cluster.cluster import FakeCluster
from kernel_queue_fake_cluster.kueue import conversion
from prerequisites import KUEUE_DATA, skip_unless_ci

Obj = dict[str, Any]
G = "kueue.x-k8s.io"
CRDS = KUEUE_DATA / "crds"
CONTAINER = {"name": "kernel", "image": "kernel:1", "resources": {"requests": {"cpu": "1"}}}
POD_SETS = [{"name": "main", "count": 1, "template": {"spec": {"containers": [CONTAINER]}}}]
USAGE = [{"name": "default-flavor", "resources": [{"name": "cpu", "total": "2"}]}]
CONDITION = {
    "type": "QuotaReserved",
    "status": "False",
    "reason": "Pending",
    "message": "couldn't assign flavors to pod set main: insufficient unused quota",
    "lastTransitionTime": "2026-08-22T10:00:00Z",
    "observedGeneration": 1,
}
GROUPS = [
    {
        "coveredResources": ["cpu"],
        "flavors": [{"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": 9}]}],
    }
]


def obj(kind: str, version: str, name: str = "x", namespace: str | None = None, **body: Any) -> Obj:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"apiVersion": f"{G}/{version}", "kind": kind, "metadata": meta, **body}


def workload(version: str, spec: Obj, status: Obj | None = None) -> Obj:
    full = {"queueName": "user-queue", "podSets": POD_SETS, **spec}
    return obj(
        "Workload", version, "g", "default", spec=full, **({"status": status} if status else {})
    )


TWO_WAY = [
    pytest.param(
        workload(
            "v1beta1",
            {
                "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
                "priorityClassName": "high",
                "priority": 1000,
            },
        ),
        workload(
            "v1beta2",
            {
                "priorityClassRef": {"group": G, "kind": "WorkloadPriorityClass", "name": "high"},
                "priority": 1000,
            },
        ),
        id="workload-priority-class",
    ),
    pytest.param(
        workload(
            "v1beta1",
            {
                "priorityClassSource": "scheduling.k8s.io/priorityclass",
                "priorityClassName": "system-node-critical",
                "priority": 2000001000,
            },
        ),
        workload(
            "v1beta2",
            {
                "priorityClassRef": {
                    "group": "scheduling.k8s.io",
                    "kind": "PriorityClass",
                    "name": "system-node-critical",
                },
                "priority": 2000001000,
            },
        ),
        id="workload-pod-priority-class",
    ),
    pytest.param(
        workload(
            "v1beta1",
            {"priority": 0},
            {"conditions": [CONDITION], "accumulatedPastExexcutionTimeSeconds": 42},
        ),
        workload(
            "v1beta2",
            {"priority": 0},
            {"conditions": [CONDITION], "accumulatedPastExecutionTimeSeconds": 42},
        ),
        id="workload-past-execution-time",
    ),
    pytest.param(
        obj("ClusterQueue", "v1beta1", spec={"cohort": "ml-team", "resourceGroups": GROUPS}),
        obj("ClusterQueue", "v1beta2", spec={"cohortName": "ml-team", "resourceGroups": GROUPS}),
        id="cluster-queue-cohort",
    ),
    pytest.param(
        obj(
            "LocalQueue",
            "v1beta1",
            namespace="team-a",
            spec={"clusterQueue": "cq"},
            status={"pendingWorkloads": 1, "flavorUsage": USAGE},
        ),
        obj(
            "LocalQueue",
            "v1beta2",
            namespace="team-a",
            spec={"clusterQueue": "cq"},
            status={"pendingWorkloads": 1, "flavorsUsage": USAGE},
        ),
        id="local-queue-usage",
    ),
    pytest.param(
        obj("ResourceFlavor", "v1beta1", spec={"nodeLabels": {"gpu": "a100"}}),
        obj("ResourceFlavor", "v1beta2", spec={"nodeLabels": {"gpu": "a100"}}),
        id="resource-flavor",
    ),
    pytest.param(
        obj("WorkloadPriorityClass", "v1beta1", value=1000),
        obj("WorkloadPriorityClass", "v1beta2", value=1000),
        id="workload-priority-class-kind",
    ),
]
ONE_WAY = [
    pytest.param(
        obj(
            "ClusterQueue", "v1beta1", spec={"admissionChecks": ["prov"], "resourceGroups": GROUPS}
        ),
        obj(
            "ClusterQueue",
            "v1beta2",
            spec={"admissionChecksStrategy": {"admissionChecks": [{"name": "prov"}]}}
            | {"resourceGroups": GROUPS},
        ),
        id="cluster-queue-admission-checks",
    ),
    pytest.param(
        obj(
            "ClusterQueue",
            "v1beta1",
            spec={
                "flavorFungibility": {"whenCanBorrow": "Borrow", "whenCanPreempt": "Preempt"},
                "resourceGroups": GROUPS,
            },
        ),
        obj(
            "ClusterQueue",
            "v1beta2",
            spec={
                "flavorFungibility": {
                    "whenCanBorrow": "MayStopSearch",
                    "whenCanPreempt": "MayStopSearch",
                },
                "resourceGroups": GROUPS,
            },
        ),
        id="cluster-queue-fungibility",
    ),
    pytest.param(
        obj(
            "LocalQueue",
            "v1beta1",
            namespace="team-a",
            spec={"clusterQueue": "cq"},
            status={"flavors": [{"name": "default-flavor"}], "flavorUsage": USAGE},
        ),
        obj(
            "LocalQueue",
            "v1beta2",
            namespace="team-a",
            spec={"clusterQueue": "cq"},
            status={"flavorsUsage": USAGE},
        ),
        id="local-queue-flavors-dropped",
    ),
    pytest.param(
        workload("v1beta2", {"priority": 0, "preemptionGates": [{"name": "gate"}]}),
        workload("v1beta1", {"priority": 0}),
        id="workload-preemption-gates-dropped",
    ),
]


@pytest.fixture(scope="module")
def schemas() -> dict[tuple[str, str], Obj]:
    """(kind, version) → the openAPIV3Schema of main's CRDs (both versions served)."""
    if not CRDS.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {CRDS} (../shared is absent)")
    return {
        (rtype.kind, version): schema
        for rtype in crd_files.load(CRDS)
        for version, schema in rtype.schemas.items()
    }


def assert_valid(schemas: dict[tuple[str, str], Obj], found: Obj) -> None:
    """`found` is a literal of its version's CRD: no violation, no field pruned."""
    version = found["apiVersion"].rpartition("/")[2]
    stored, causes = openapi.prune_default_validate(found, schemas[(found["kind"], version)])
    assert causes == []
    assert pruned(found, stored) == []


def pruned(given: Any, stored: Any, where: str = "") -> list[str]:
    """The paths of `given` that `stored` lacks."""
    if isinstance(given, dict) and isinstance(stored, dict):
        return [
            p
            for key, value in given.items()
            for p in (
                [f"{where}.{key}"]
                if key not in stored
                else pruned(value, stored[key], f"{where}.{key}")
            )
        ]
    if isinstance(given, list) and isinstance(stored, list):
        return [p for a, b in zip(given, stored, strict=True) for p in pruned(a, b, f"{where}[]")]
    return []


@pytest.mark.parametrize(("v1beta1", "v1beta2"), TWO_WAY)
def test_conversion_maps_each_field_that_differs_both_ways(
    schemas: dict[tuple[str, str], Obj], v1beta1: Obj, v1beta2: Obj
) -> None:
    assert_valid(schemas, v1beta1)
    assert_valid(schemas, v1beta2)
    assert conversion.convert(v1beta1, f"{G}/v1beta2") == v1beta2
    assert conversion.convert(v1beta2, f"{G}/v1beta1") == v1beta1


@pytest.mark.parametrize(("given", "converted"), ONE_WAY)
def test_conversion_of_a_field_the_other_version_lacks_moves_or_drops_it(
    schemas: dict[tuple[str, str], Obj], given: Obj, converted: Obj
) -> None:
    assert_valid(schemas, given)
    assert_valid(schemas, converted)
    assert conversion.convert(given, converted["apiVersion"]) == converted


@pytest.mark.parametrize(("v1beta1", "v1beta2"), TWO_WAY)
def test_a_round_trip_gives_back_what_went_in_and_changes_nothing_given(
    v1beta1: Obj, v1beta2: Obj
) -> None:
    sent = json.dumps([v1beta1, v1beta2], sort_keys=True)
    down = conversion.convert(conversion.convert(v1beta2, f"{G}/v1beta1"), f"{G}/v1beta2")
    up = conversion.convert(conversion.convert(v1beta1, f"{G}/v1beta2"), f"{G}/v1beta1")
    assert (down, up) == (v1beta2, v1beta1)
    assert json.dumps([v1beta1, v1beta2], sort_keys=True) == sent
    assert conversion.convert(v1beta2, v1beta2["apiVersion"]) == v1beta2


# -- over HTTP: a 0.19 cluster serving both versions -----------------------------------------


@pytest.fixture
def served(tmp_path: Path, jp_asyncio_loop: asyncio.AbstractEventLoop) -> Iterator[FakeCluster]:
    """A started 0.19 cluster of main's CRDs, no kubelet, Kueue admitting by hand only."""
    if not CRDS.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {CRDS} (../shared is absent)")
    cluster = FakeCluster(
        root_dir=tmp_path / "c", crds=CRDS, kueue="0.19", kubelet=False, manual_admission=True
    )
    jp_asyncio_loop.run_until_complete(cluster.start())
    yield cluster
    jp_asyncio_loop.run_until_complete(cluster.stop())


async def request(
    cluster: FakeCluster, method: str, path: str, body: Any = None, media: str = ""
) -> tuple[int, Any]:
    """One raw request, its status and JSON reply."""
    headers = {"Content-Type": media or "application/json"} if body is not None else {}
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as http,
        http.request(method, cluster.url + path, data=json.dumps(body), headers=headers) as reply,
    ):
        return reply.status, json.loads(await reply.text())


def path(version: str, plural: str, name: str = "", namespace: str = "") -> str:
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{G}/{version}{scope}/{plural}" + (f"/{name}" if name else "")


async def test_a_cluster_queue_written_at_v1beta1_is_stored_and_read_at_v1beta2(
    served: FakeCluster,
) -> None:
    sent = obj("ClusterQueue", "v1beta1", "cq", spec={"cohort": "ml", "resourceGroups": GROUPS})
    status, created = await request(served, "POST", path("v1beta1", "clusterqueues"), sent)
    assert status == 201
    assert created["apiVersion"] == f"{G}/v1beta1" and created["spec"]["cohort"] == "ml"
    stored = served.store.get(G, "clusterqueues", None, "cq")
    assert stored["apiVersion"] == f"{G}/v1beta2"
    assert stored["spec"]["cohortName"] == "ml" and "cohort" not in stored["spec"]
    _, read = await request(served, "GET", path("v1beta2", "clusterqueues", "cq"))
    assert (read["apiVersion"], read["spec"]["cohortName"]) == (f"{G}/v1beta2", "ml")
    _, listed = await request(served, "GET", path("v1beta1", "clusterqueues"))
    assert listed["apiVersion"] == f"{G}/v1beta1"
    assert [(i["apiVersion"], i["spec"]["cohort"]) for i in listed["items"]] == [
        (f"{G}/v1beta1", "ml")
    ]
    patch = {"spec": {"cohort": "research"}}
    media = "application/merge-patch+json"
    where = path("v1beta1", "clusterqueues", "cq")
    status, patched = await request(served, "PATCH", where, patch, media)
    assert (status, patched["spec"]["cohort"]) == (200, "research")
    assert served.store.get(G, "clusterqueues", None, "cq")["spec"]["cohortName"] == "research"
    _, current = await request(served, "GET", where)
    current["spec"]["cohort"] = "ops"
    status, replaced = await request(served, "PUT", where, current)
    assert (status, replaced["spec"]["cohort"]) == (200, "ops")
    assert served.store.get(G, "clusterqueues", None, "cq")["spec"]["cohortName"] == "ops"


async def test_a_write_is_validated_against_the_schema_of_the_version_it_names(
    served: FakeCluster,
) -> None:
    bad_source = workload("v1beta1", {"priority": 1, "priorityClassName": "high"})
    bad_source["spec"]["priorityClassSource"] = "kueue.x-k8s.io/nope"
    status, refused = await request(
        served, "POST", path("v1beta1", "workloads", namespace="default"), bad_source
    )
    assert status == 422
    assert refused["details"]["causes"][0]["field"] == "spec.priorityClassSource"
    bad_ref = workload("v1beta2", {"priority": 1})
    bad_ref["spec"]["priorityClassRef"] = {"group": G, "kind": "Nope", "name": "high"}
    status, refused = await request(
        served, "POST", path("v1beta2", "workloads", namespace="default"), bad_ref
    )
    assert status == 422
    assert refused["details"]["causes"][0]["field"] == "spec.priorityClassRef.kind"
    # v1beta2's field sent at v1beta1 is unknown there: pruned, as the apiserver does
    other = workload("v1beta1", {"priority": 1})
    other["metadata"]["name"] = "other"
    other["spec"]["priorityClassRef"] = {"group": G, "kind": "WorkloadPriorityClass", "name": "a"}
    status, created = await request(
        served, "POST", path("v1beta1", "workloads", namespace="default"), other
    )
    assert status == 201 and "priorityClassRef" not in created["spec"]
    stored = served.store.get(G, "workloads", "default", "other")
    assert "priorityClassRef" not in stored["spec"]


async def test_watches_at_either_version_get_the_controllers_writes_in_their_version(
    served: FakeCluster,
) -> None:
    since = served.store.resource_version
    served.setup_queues(namespace="default", quota={"cpu": 4})
    assert served.kueue is not None
    await served.kueue.settle()
    streams = {}
    for version in ("v1beta1", "v1beta2"):
        url = path(version, "localqueues", namespace="default")
        streams[version] = await watch(served, f"{url}?watch=1&resourceVersion={since}")
    for version, field, other in (
        ("v1beta1", "flavorUsage", "flavorsUsage"),
        ("v1beta2", "flavorsUsage", "flavorUsage"),
    ):
        objects = [e["object"] for e in streams[version]]
        assert {o["apiVersion"] for o in objects} == {f"{G}/{version}"}
        written = [o["status"] for o in objects if "status" in o]
        assert written and all(field in s and other not in s for s in written)


async def watch(cluster: FakeCluster, url: str) -> list[Obj]:
    """The events of a watch that ends by itself after a second (timeoutSeconds)."""
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as http,
        http.get(f"{cluster.url}{url}&timeoutSeconds=1") as reply,
    ):
        assert reply.status == 200
        return [json.loads(line) async for line in reply.content if line.strip()]
