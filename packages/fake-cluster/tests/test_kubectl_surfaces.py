"""What the fake API server publishes for kubectl, read directly: the OpenAPI v3 documents,
field validation, protobuf bodies and Tables (test_kubectl.py drives the same through kubectl)."""

from __future__ import annotations

import datetime
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from kernel_queue_fake_cluster.apiserver import fields, openapi, printers, resources, tables
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import ResourceType
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.cluster import FakeCluster


@pytest.fixture(scope="module")
def store() -> Store:
    found = Store()
    resources.install(found)
    return found


def _refs(value: Any) -> set[str]:
    if isinstance(value, dict):
        ref = value.get("$ref")
        found = {ref} if isinstance(ref, str) else set()
        return found.union(*(_refs(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_refs(v) for v in value))
    return set()


def test_every_group_version_has_a_document_whose_references_all_resolve(store: Store) -> None:
    index = openapi.index(store)["paths"]
    assert {"api/v1", "apis/kueue.x-k8s.io/v1beta2", "apis/rbac.authorization.k8s.io/v1"} <= set(
        index
    )
    for name, entry in index.items():
        assert entry["serverRelativeURL"].startswith(f"/openapi/v3/{name}?hash=")
        document = openapi.serve(store, f"/openapi/v3/{name}")
        schemas = document["components"]["schemas"]
        missing = {ref for ref in _refs(document) if ref.removeprefix(openapi.REF) not in schemas}
        assert missing == set(), name


def test_a_kinds_document_names_its_kind_and_takes_field_validation(store: Store) -> None:
    core = openapi.document(store, "api/v1")
    pod = core["components"]["schemas"]["io.k8s.api.core.v1.Pod"]
    assert pod["x-kubernetes-group-version-kind"] == [{"group": "", "kind": "Pod", "version": "v1"}]
    patch = core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
    assert [p["name"] for p in patch["parameters"]] == ["fieldValidation"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    containers = core["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"]
    assert containers["containers"]["x-kubernetes-patch-merge-key"] == "name"
    assert containers["containers"]["type"] == "array"  # ["array", "null"] in the JSON schema

    kueue = openapi.document(store, "apis/kueue.x-k8s.io/v1beta2")
    workload = kueue["components"]["schemas"]["io.x-k8s.kueue.v1beta2.Workload"]
    assert workload["properties"]["metadata"] == {
        "allOf": [{"$ref": openapi.REF + openapi.OBJECT_META}]
    }
    with pytest.raises(ApiError) as caught:
        openapi.serve(store, "/openapi/v3/apis/apps/v1")
    assert caught.value.code == 404


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        pytest.param({"spec": {"containers": [{"name": "m", "ports": [{"containerPort": "80"}]}]}},
                     "json: cannot unmarshal string into Go struct field ContainerPort."
                     "spec.containers.ports.containerPort of type int32", id="wrong-type"),
        pytest.param({"spec": {"containers": [{"name": "m", "resources": {"limits": {"cpu": 2}}}],
                               "bogus": True}},
                     'strict decoding error: unknown field "spec.bogus"', id="unknown-field"),
        pytest.param({"metadata": {"labels": {"a": "b"}, "nope": 1}},
                     'strict decoding error: unknown field "metadata.nope"', id="unknown-in-meta"),
    ],
)  # fmt: skip
def test_strict_field_validation_names_the_field(store: Store, body: dict, problem: str) -> None:
    with pytest.raises(ApiError) as caught:
        fields.check(store.type("", "pods"), "v1", "Strict", {"kind": "Pod", **body})
    assert caught.value.code == 400
    assert caught.value.message == f'Pod in version "v1" cannot be handled as a Pod: {problem}'


def test_field_validation_lets_valid_bodies_and_strategic_directives_through(
    store: Store,
) -> None:
    pods = store.type("", "pods")
    patch = {
        "spec": {
            "$setElementOrder/containers": [{"name": "m"}],
            "containers": [{"name": "m", "ports": [{"containerPort": 80, "name": None}]}],
        },
        "metadata": {"creationTimestamp": None, "labels": {"a": "b"}},
    }
    assert fields.check(pods, "v1", "Strict", patch) == []
    assert fields.check(pods, "v1", "Warn", {"spec": {"x": 1}}) == ['unknown field "spec.x"']
    assert fields.check(pods, "v1", "", {"spec": {"x": 1}}) == []
    with pytest.raises(ApiError) as caught:
        fields.check(pods, "v1", "strict", {})
    assert caught.value.code == 400


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (119, "119s"), (125, "2m5s"), (600, "10m"), (3 * 3600, "3h"),
     (3 * 3600 + 60, "3h1m"), (30 * 3600, "30h"), (50 * 3600, "2d2h"), (40 * 86400, "40d"),
     (800 * 86400, "2y70d")],
)  # fmt: skip
def test_ages_are_worded_as_the_apiserver_words_them(seconds: int, shown: str) -> None:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    then = (now - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert printers.age(then, now) == shown


def _pod(**status: Any) -> dict:
    meta = {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"}
    return {"metadata": meta, "spec": {"containers": [{"name": "m"}]}, "status": status}


@pytest.mark.parametrize(
    ("pod", "ready", "reason"),
    [
        pytest.param(_pod(phase="Pending", conditions=[{"type": "PodScheduled",
                     "status": "False", "reason": "SchedulingGated"}]), "0/1", "SchedulingGated",
                     id="gated"),
        pytest.param(_pod(phase="Pending", containerStatuses=[{"state": {"waiting": {
                     "reason": "ContainerCreating"}}}]), "0/1", "ContainerCreating", id="creating"),
        pytest.param(_pod(phase="Succeeded", containerStatuses=[{"state": {"terminated": {
                     "reason": "Completed", "exitCode": 0}}}]), "0/1", "Completed", id="completed"),
        pytest.param(_pod(phase="Failed", containerStatuses=[{"state": {"terminated": {
                     "exitCode": 3}}}]), "0/1", "ExitCode:3", id="exit-code"),
        pytest.param({**_pod(phase="Running", containerStatuses=[{"ready": True, "state": {
                     "running": {}}}]), "metadata": {"name": "p", "deletionTimestamp": "x"}},
                     "1/1", "Terminating", id="terminating"),
    ],
)  # fmt: skip
def test_a_pods_row_says_what_kubectl_would(
    store: Store, pod: dict, ready: str, reason: str
) -> None:
    table = tables.table(store.type("", "pods"), "v1", pod, {})
    assert table["rows"][0]["cells"][1:3] == [ready, reason]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


def _post(url: str, body: bytes, media: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": media})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_a_protobuf_body_of_a_kind_the_fake_cannot_read_is_415(fake_cluster: FakeCluster) -> None:
    deployment = _field(1, _field(1, b"apps/v1") + _field(2, b"Deployment"))
    url = fake_cluster.url + "/api/v1/namespaces/default/configmaps"
    code, status = _post(url, b"k8s\x00" + deployment, "application/vnd.kubernetes.protobuf")
    assert (code, status["reason"]) == (415, "UnsupportedMediaType")
    assert "ConfigMap, Namespace" in status["message"] and "not Deployment" in status["message"]
    code, status = _post(url, b"not protobuf", "application/vnd.kubernetes.protobuf")
    assert (code, status["message"]) == (400, "the protobuf body lacks the k8s\\0 prefix")
    crd = fake_cluster.url + "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"
    code, status = _post(crd, b"k8s\x00", "application/vnd.kubernetes.protobuf")
    assert code == 415 and status["message"].endswith("include: application/json")


def test_a_documents_hash_changes_with_its_schemas() -> None:
    """kubectl caches each document by its hash: another schema must get another hash."""

    def url(schema: dict) -> str:
        found = Store()
        found.register(
            ResourceType("example.com", "things", "Thing", builtin=False, schemas={"v1": schema})
        )
        return str(openapi.index(found)["paths"]["apis/example.com/v1"]["serverRelativeURL"])

    one = {"type": "object", "properties": {"spec": {"type": "object"}}}
    assert url(one) == url(dict(one))
    assert url(one) != url({"type": "object", "properties": {"spec": {"type": "string"}}})
