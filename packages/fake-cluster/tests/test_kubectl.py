"""The fake cluster as a kubectl user meets it: `kubectl create` of built-in kinds (sent as
protobuf), Secrets' `stringData`, `kubectl apply` with validation on, server-side printing,
Nodes, and deleting an admitted group's pod."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_queue_fake_cluster.cluster import FakeCluster
from kubectl import Kubectl


@pytest.fixture
def kubectl(fake_cluster: FakeCluster, tmp_path: Path) -> Iterator[Kubectl]:
    yield Kubectl(fake_cluster, tmp_path / "home")


def _get(fake_cluster: FakeCluster, plural: str, namespace: str | None, name: str) -> dict:
    return fake_cluster.call(fake_cluster.store.get, "", plural, namespace, name)


# -- kubectl create of built-in kinds (protobuf bodies) ---------------------------------------


def test_kubectl_creates_a_namespace(kubectl: Kubectl, fake_cluster: FakeCluster) -> None:
    assert kubectl("create", "namespace", "team-a") == "namespace/team-a created\n"
    assert _get(fake_cluster, "namespaces", None, "team-a")["metadata"]["name"] == "team-a"


def test_kubectl_creates_a_generic_secret(kubectl: Kubectl, fake_cluster: FakeCluster) -> None:
    out = kubectl("create", "secret", "generic", "s", "--from-literal=a=b")
    assert out == "secret/s created\n"
    secret = _get(fake_cluster, "secrets", "default", "s")
    assert (secret["type"], secret["data"]) == ("Opaque", {"a": base64.b64encode(b"b").decode()})


def test_kubectl_creates_a_configmap(kubectl: Kubectl, fake_cluster: FakeCluster) -> None:
    out = kubectl("create", "configmap", "c", "--from-literal=a=b", "-n", "default")
    assert out == "configmap/c created\n"
    assert _get(fake_cluster, "configmaps", "default", "c")["data"] == {"a": "b"}


# -- Secrets' stringData ----------------------------------------------------------------------

SECRET = """
apiVersion: v1
kind: Secret
metadata: {name: creds}
data: {user: %s, token: %s}
stringData: {token: %s}
"""


def test_a_secrets_string_data_is_folded_into_data_on_create_and_update(
    kubectl: Kubectl, fake_cluster: FakeCluster
) -> None:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    kubectl("apply", "--validate=false", "-f", "-", stdin=SECRET % (b64("ann"), b64("old"), "new"))
    secret = json.loads(kubectl("get", "secret", "creds", "-o", "json"))
    assert secret["data"] == {"user": b64("ann"), "token": b64("new")}
    assert "stringData" not in secret

    kubectl(
        "apply", "--validate=false", "-f", "-", stdin=SECRET % (b64("bob"), b64("old"), "newer")
    )
    stored = _get(fake_cluster, "secrets", "default", "creds")
    assert stored["data"] == {"user": b64("bob"), "token": b64("newer")}
    assert "stringData" not in stored
