"""The fake cluster as each Kueue release it emulates (`kueue/releases.py`): the release named, the
CRDs it takes and refuses, what discovery lists for Kueue's groups, the visibility API at the
versions it installs, and Kueue's own example manifests of that release loaded unchanged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from kernel_queue_fake_cluster import CrdsMismatch
from kernel_queue_fake_cluster.cluster import FakeCluster
from kernel_queue_fake_cluster.kueue import releases
from prerequisites import KUEUE_DATA, skip_unless_ci

Obj = dict[str, Any]
G, VISIBILITY = "kueue.x-k8s.io", "visibility.kueue.x-k8s.io"
MAIN, V014 = KUEUE_DATA, KUEUE_DATA / "v0.14"
CRDS = {"0.14": V014 / "crds", "0.19": MAIN / "crds", "0.20": MAIN / "crds"}
EXAMPLES = {"0.14": V014 / "examples", "0.19": MAIN / "examples", "0.20": MAIN / "examples"}
RELEASES = ["0.14", "0.19", "0.20"]


def _shared_or_skip() -> None:
    for path in (MAIN / "crds", V014 / "crds", MAIN / "examples", V014 / "examples"):
        if not path.is_dir():
            skip_unless_ci(f"Kueue's CRDs and examples are not at {path} (../shared is absent)")


@pytest.fixture
def start(tmp_path: Path, jp_asyncio_loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
    """`await start(release, **options)`: a started cluster of that release's CRDs, no kubelet
    unless asked; every one is stopped after the test."""
    _shared_or_skip()
    made: list[FakeCluster] = []

    async def make(release: str, **options: Any) -> FakeCluster:
        options.setdefault("kubelet", False)
        options.setdefault("crds", CRDS[release])
        cluster = FakeCluster(root_dir=tmp_path / f"c{len(made)}", kueue=release, **options)
        made.append(cluster)
        return await cluster.start()

    yield make
    for cluster in made:
        jp_asyncio_loop.run_until_complete(cluster.stop())


async def get(cluster: FakeCluster, path: str) -> tuple[int, Obj]:
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as http,
        http.get(cluster.url + path) as reply,
    ):
        return reply.status, json.loads(await reply.text())


async def post(cluster: FakeCluster, doc: Obj) -> tuple[int, Obj]:
    """POST a manifest unchanged at its apiVersion, as `kubectl create -f` does."""
    namespace = (doc.get("metadata") or {}).get("namespace", "default")
    if doc["apiVersion"] == "v1":
        where = f"/api/v1/namespaces/{namespace}/pods"
    else:
        plural = doc["kind"].lower() + ("es" if doc["kind"].endswith("s") else "s")
        scope = f"namespaces/{namespace}/" if doc["kind"] == "LocalQueue" else ""
        where = f"/apis/{doc['apiVersion']}/{scope}{plural}"
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as http,
        http.post(cluster.url + where, json=doc) as reply,
    ):
        return reply.status, json.loads(await reply.text())


# -- the release named, and its CRDs -----------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "name"),
    [
        pytest.param("0.14", "0.14", id="0.14"),
        pytest.param("v0.14.8", "0.14", id="a-tag"),
        pytest.param("0.19", "0.19", id="0.19"),
        pytest.param("0.20", "0.20", id="0.20"),
        pytest.param(True, "0.19", id="true-is-the-default"),
    ],
)
def test_a_release_is_named_by_its_minor_version(given: bool | str, name: str) -> None:
    found = releases.named(given)
    assert found is not None and found.name == name
    assert releases.named(False) is None


def test_an_unknown_release_names_the_ones_emulated() -> None:
    with pytest.raises(ValueError) as caught:
        releases.named("0.17")
    assert str(caught.value) == (
        "The fake cluster does not emulate Kueue '0.17': choose one of 0.14, 0.19, 0.20 "
        "(the default 0.19)"
    )


def test_true_with_crds_serving_v1beta1_only_is_0_14(tmp_path: Path) -> None:
    _shared_or_skip()
    cluster = FakeCluster(root_dir=tmp_path, crds=CRDS["0.14"], kubelet=False)
    assert cluster.release is not None and cluster.release.name == "0.14"


@pytest.mark.parametrize(
    ("release", "crds", "served"),
    [
        pytest.param("0.14", "0.19", "v1beta1 and v1beta2 (storage v1beta2)", id="0.14-of-main"),
        pytest.param("0.19", "0.14", "v1beta1 only (storage v1beta1)", id="0.19-of-0.14"),
        pytest.param("0.20", "0.14", "v1beta1 only (storage v1beta1)", id="0.20-of-0.14"),
    ],
)
def test_crds_of_another_release_are_refused_naming_both(
    tmp_path: Path, release: str, crds: str, served: str
) -> None:
    _shared_or_skip()
    profile = releases.RELEASES[release]
    with pytest.raises(CrdsMismatch) as caught:
        FakeCluster(root_dir=tmp_path, crds=CRDS[crds], kueue=release)
    wanted = (
        " and ".join(sorted(profile.served))
        if len(profile.served) > 1
        else (f"{profile.served[0]} only")
    )
    assert str(caught.value) == (
        f"The Kueue CRDs at {CRDS[crds]} serve ClusterQueue at {served}, but Kueue {release} "
        f"serves {wanted} (storage {profile.storage}): give {profile.crds} with crds=PATH, "
        "--crds PATH or $KERNEL_QUEUE_FAKE_CLUSTER_CRDS."
    )
    assert isinstance(caught.value, ValueError)


# -- discovery ---------------------------------------------------------------------------------

DISCOVERY = {
    # release: (kueue.x-k8s.io versions, visibility versions), preferred first
    "0.14": (["v1beta1"], ["v1beta1"]),
    "0.19": (["v1beta2", "v1beta1"], ["v1beta2", "v1beta1"]),
    "0.20": (["v1beta2"], ["v1beta2"]),
}


@pytest.mark.parametrize("release", RELEASES)
async def test_discovery_lists_exactly_the_versions_the_release_serves(
    start: Any, release: str
) -> None:
    cluster = await start(release)
    _, groups = await get(cluster, "/apis")
    listed = {
        g["name"]: ([v["version"] for v in g["versions"]], g["preferredVersion"]["version"])
        for g in groups["groups"]
    }
    for group, versions in zip((G, VISIBILITY), DISCOVERY[release], strict=True):
        assert listed[group] == (versions, versions[0])
        status, one = await get(cluster, f"/apis/{group}")
        assert status == 200 and [v["version"] for v in one["versions"]] == versions
        for version in ("v1beta1", "v1beta2"):
            status, resources = await get(cluster, f"/apis/{group}/{version}")
            assert status == (200 if version in versions else 404)
            if status == 200:
                names = {r["name"] for r in resources["resources"]}
                wanted = "workloads" if group == G else "localqueues/pendingworkloads"
                assert wanted in names
    status, _ = await get(cluster, f"/apis/{G}/v1alpha1/namespaces/default/workloads")
    assert status == 404


@pytest.mark.parametrize("release", RELEASES)
async def test_only_the_served_versions_answer_and_the_visibility_api_pages_at_each(
    start: Any, release: str
) -> None:
    cluster = await start(release)
    cluster.setup_queues(quota={"cpu": 1})
    kueue_versions, visibility_versions = DISCOVERY[release]
    for version in ("v1beta1", "v1beta2"):
        status, listed = await get(cluster, f"/apis/{G}/{version}/namespaces/default/localqueues")
        assert status == (200 if version in kueue_versions else 404)
        if status == 200:
            assert [q["apiVersion"] for q in listed["items"]] == [f"{G}/{version}"]
        where = f"/apis/{VISIBILITY}/{version}/namespaces/default/localqueues/user-queue"
        status, page = await get(cluster, f"{where}/pendingworkloads")
        assert status == (200 if version in visibility_versions else 404)
        if status == 200:
            assert (page["apiVersion"], page["items"]) == (f"{VISIBILITY}/{version}", [])


async def test_a_cluster_may_serve_its_visibility_api_at_other_versions(start: Any) -> None:
    cluster = await start("0.19", visibility=["v1beta1"])
    _, groups = await get(cluster, f"/apis/{VISIBILITY}")
    assert [v["version"] for v in groups["versions"]] == ["v1beta1"]


# -- Kueue's example manifests of each release -------------------------------------------------


def documents(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("release", RELEASES)
async def test_every_example_of_the_release_loads_unchanged_at_its_version(
    start: Any, release: str
) -> None:
    paths = sorted(EXAMPLES[release].glob("*.yaml"))
    assert len(paths) >= 5
    for path in paths:  # a cluster each: the examples reuse names ("spot")
        cluster = await start(release)
        for doc in documents(path):
            status, created = await post(cluster, doc)
            assert status == 201, (path.name, created)
            assert created["apiVersion"] == doc["apiVersion"]
            meta = created["metadata"]
            rtype = next(t for t in cluster.store.types.values() if t.kind == doc["kind"])
            stored = cluster.store.get(
                rtype.group, rtype.plural, meta.get("namespace"), meta["name"]
            )
            assert stored["apiVersion"] == rtype.api_version()  # the storage version


@pytest.mark.parametrize("release", RELEASES)
async def test_the_releases_example_pod_group_is_admitted_by_its_example_queues(
    start: Any, release: str
) -> None:
    cluster = await start(release)
    for name in ("admin-single-clusterqueue-setup.yaml", "pods-kueue-kueue-pod-group.yaml"):
        for doc in documents(EXAMPLES[release] / name):
            assert (await post(cluster, doc))[0] == 201
    assert cluster.kueue is not None
    await cluster.kueue.settle()
    version = DISCOVERY[release][0][0]
    where = f"/apis/{G}/{version}/namespaces/default/workloads/sample-group"
    status, wl = await get(cluster, where)
    assert status == 200 and wl["apiVersion"] == f"{G}/{version}"
    admitted = [c for c in wl["status"]["conditions"] if c["type"] == "Admitted"]
    assert [c["status"] for c in admitted] == ["True"]


@pytest.mark.parametrize("release", ["0.14", "0.20"])
async def test_a_manifest_at_a_version_the_release_does_not_serve_is_not_found(
    start: Any, release: str
) -> None:
    cluster = await start(release)
    other = {"0.14": "v1beta2", "0.20": "v1beta1"}[release]
    flavor = {"apiVersion": f"{G}/{other}", "kind": "ResourceFlavor", "metadata": {"name": "f"}}
    status, refused = await post(cluster, flavor)
    assert (status, refused["reason"]) == (404, "NotFound")
    with pytest.raises(
        Exception, match=f'no matches for kind "ResourceFlavor" in version "{G}/{other}"'
    ):
        cluster.apply([flavor])
    assert cluster.apply(cluster.for_release([flavor]))[0]["metadata"]["name"] == "f"
