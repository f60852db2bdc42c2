"""Where the fake cluster finds Kueue's CRDs: a path it is given (a directory of CRD files, or one
multi-document YAML such as a Kueue release's manifests.yaml), else
$KERNEL_QUEUE_FAKE_CLUSTER_CRDS, else an error that says how to give them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_queue_fake_cluster import CrdsNotFound
from kernel_queue_fake_cluster.apiserver import crds as crd_files
from kernel_queue_fake_cluster.apiserver.kinds import ResourceType
from kernel_queue_fake_cluster.cluster import FakeCluster
from prerequisites import KUEUE_DATA, skip_unless_ci

VARIABLE = crd_files.ENVIRONMENT_VARIABLE
CRDS = KUEUE_DATA / "crds"
OTHER_KINDS = """\
apiVersion: v1
kind: Namespace
metadata:
  name: kueue-system
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: kueue-controller-manager
  namespace: kueue-system
"""


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    """A release-style manifests.yaml: Kueue's CRD files of the checkout joined into one
    stream, between objects of other kinds (as a release's file holds its Deployment)."""
    if not CRDS.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {CRDS} (../shared is absent)")
    documents = [OTHER_KINDS] + [path.read_text() for path in sorted(CRDS.glob("*.yaml"))]
    path = tmp_path / "manifests.yaml"
    path.write_text("\n---\n".join(documents))
    return path


def kinds(types: list[ResourceType]) -> list[tuple[str, str, tuple[str, ...]]]:
    return sorted((t.group, t.kind, t.versions) for t in types)


def test_a_release_manifests_file_gives_the_kinds_of_the_crd_directory(manifests: Path) -> None:
    from_directory = crd_files.load(CRDS)
    from_file = crd_files.load(manifests)
    assert kinds(from_file) == kinds(from_directory)
    assert ("kueue.x-k8s.io", "Workload", ("v1beta1", "v1beta2")) in kinds(from_file)
    assert len(from_file) == len(list(CRDS.glob("*.yaml")))
    workload = next(t for t in from_file if t.kind == "Workload")
    assert workload.schemas.keys() == {"v1beta1", "v1beta2"}


def test_the_variable_names_the_crds_when_no_path_is_given(
    manifests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, str(manifests))
    assert crd_files.locate() == manifests
    assert kinds(crd_files.load()) == kinds(crd_files.load(CRDS))


async def test_a_cluster_from_a_manifests_file_serves_kueue_kinds(
    manifests: Path, tmp_path: Path
) -> None:
    async with FakeCluster(root_dir=tmp_path / "c", crds=manifests, kubelet=False) as cluster:
        cluster.setup_queues()
        queues = cluster.store.list_objects("kueue.x-k8s.io", "localqueues", "default")[0]
        assert [q["metadata"]["name"] for q in queues] == ["user-queue"]
        assert ("apps", "deployments") not in cluster.store.types


def test_without_a_path_or_the_variable_the_error_says_how_to_give_the_crds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    with pytest.raises(CrdsNotFound) as caught:
        FakeCluster(root_dir=tmp_path)
    assert str(caught.value) == (
        "The fake cluster needs Kueue's CRDs and none was given: pass crds=PATH (--crds PATH "
        "to `jupyter kernel-queue fake-cluster`), or set KERNEL_QUEUE_FAKE_CLUSTER_CRDS, to a "
        "directory of Kueue's CRD files or to Kueue's release manifests.yaml "
        "(https://github.com/kubernetes-sigs/kueue/releases/download/vX.Y.Z/manifests.yaml)."
    )
    assert isinstance(caught.value, FileNotFoundError)
    monkeypatch.setenv(VARIABLE, "")  # empty is unset
    with pytest.raises(CrdsNotFound, match="none was given"):
        crd_files.locate()


@pytest.mark.parametrize("given", ["argument", "variable"])
def test_a_missing_path_is_named_with_where_it_came_from(
    given: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-crds"
    monkeypatch.setenv(VARIABLE, str(missing))
    with pytest.raises(CrdsNotFound) as caught:
        FakeCluster(root_dir=tmp_path, crds=missing if given == "argument" else None)
    origin = "crds" if given == "argument" else "$KERNEL_QUEUE_FAKE_CLUSTER_CRDS"
    assert str(caught.value).startswith(f"No Kueue CRDs at {missing} (from {origin}): pass ")


def test_a_file_without_a_crd_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "manifests.yaml"
    path.write_text(OTHER_KINDS)
    with pytest.raises(CrdsNotFound, match=f"No CustomResourceDefinition in {path}: pass "):
        crd_files.load(path)


async def test_crds_false_serves_built_in_kinds_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)  # not read at all
    async with FakeCluster(root_dir=tmp_path, crds=False, kueue=False, kubelet=False) as cluster:
        assert {group for group, _ in cluster.store.types} == {"", "rbac.authorization.k8s.io"}
    with pytest.raises(ValueError, match="the fake Kueue needs Kueue's CRDs"):
        FakeCluster(root_dir=tmp_path, crds=False)
