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
from kubectl import Kubectl, until


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

    kubectl("apply", "-f", "-", stdin=SECRET % (b64("ann"), b64("old"), "new"))
    secret = json.loads(kubectl("get", "secret", "creds", "-o", "json"))
    assert secret["data"] == {"user": b64("ann"), "token": b64("new")}
    assert "stringData" not in secret

    kubectl("apply", "-f", "-", stdin=SECRET % (b64("bob"), b64("old"), "newer"))
    stored = _get(fake_cluster, "secrets", "default", "creds")
    assert stored["data"] == {"user": b64("bob"), "token": b64("newer")}
    assert "stringData" not in stored


# -- kubectl apply with validation on (OpenAPI v3 and server-side field validation) ---------

POD = """
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers: [{name: main, image: %s, ports: [{containerPort: 8888}]}]
  %s
"""
CLUSTER_QUEUE = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: cq}
spec:
  namespaceSelector: {}
  %s
"""


def test_kubectl_apply_validates_with_the_servers_schemas(kubectl: Kubectl) -> None:
    assert kubectl("apply", "-f", "-", stdin=POD % ("python", "")) == "pod/p created\n"
    assert kubectl("apply", "-f", "-", stdin=CLUSTER_QUEUE % "") == (
        "clusterqueue.kueue.x-k8s.io/cq created\n"
    )

    unknown = kubectl.fails("apply", "-f", "-", stdin=POD % ("python", "foo: 1"))
    assert 'strict decoding error: unknown field "spec.foo"' in unknown
    assert 'Pod in version "v1" cannot be handled as a Pod' in unknown
    nested = POD.replace("containerPort: 8888", "containerPort: 8888, bar: x") % ("python", "")
    unknown = kubectl.fails("apply", "-f", "-", stdin=nested)
    assert 'unknown field "spec.containers[0].ports[0].bar"' in unknown
    wrong = kubectl.fails("apply", "-f", "-", stdin=POD % ("{a: 1}", ""))
    assert "cannot unmarshal object into Go struct field Container.spec.containers.image" in wrong

    unknown = kubectl.fails("apply", "-f", "-", stdin=CLUSTER_QUEUE % "foo: 1")
    assert 'strict decoding error: unknown field "spec.foo"' in unknown
    wrong = kubectl.fails("apply", "-f", "-", stdin=CLUSTER_QUEUE % "cohortName: [1]")
    assert "spec.cohortName" in wrong

    # an object that exists is patched: the patch is held to the schema too
    unknown = kubectl.fails("apply", "-f", "-", stdin=CLUSTER_QUEUE % "stopPolicy: Hold\n  foo: 1")
    assert 'strict decoding error: unknown field "spec.foo"' in unknown
    changed = kubectl("apply", "-f", "-", stdin=CLUSTER_QUEUE % "stopPolicy: Hold")
    assert changed == "clusterqueue.kueue.x-k8s.io/cq configured\n"


def test_kubectl_explain_reads_the_servers_schemas(kubectl: Kubectl) -> None:
    assert "containerPort" in kubectl("explain", "pods.spec.containers.ports")
    assert "queueName" in kubectl("explain", "workloads.spec")


# -- kubectl delete of an admitted group's pod ------------------------------------------------

GROUP_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: %(name)s
  labels: {kueue.x-k8s.io/queue-name: user-queue, kueue.x-k8s.io/pod-group-name: %(group)s}
  annotations: {kueue.x-k8s.io/pod-group-total-count: "1"}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 10
  containers:
  - name: main
    image: python
    command: [python, -c, "%(code)s"]
    resources: {requests: {cpu: "1"}}
"""
EXIT_0_ON_SIGTERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
    "time.sleep(600)"
)
KILLED_BY_SIGTERM = "import time; time.sleep(600)"


def _running(kubectl: Kubectl, name: str) -> bool:
    return kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}") == "Running"


def _workload(fake_cluster: FakeCluster, name: str) -> dict | None:
    found = fake_cluster.call(fake_cluster.store.list_objects, "kueue.x-k8s.io", "workloads")
    return next((w for w in found[0] if w["metadata"]["name"] == name), None)


def _condition(workload: dict | None, kind: str) -> str:
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == kind), "")


def test_kubectl_delete_of_an_admitted_group_pod_returns_once_kueue_lets_it_go(
    kubectl: Kubectl, fake_cluster: FakeCluster
) -> None:
    """As Kueue's pod-group controller does (and its troubleshooting guide says), the pod's
    `kueue.x-k8s.io/managed` finalizer goes once its group finished, or, for a Failed pod, once
    a replacement pod exists; until then a Failed pod stays, so the group can be retried."""
    fake_cluster.call(fake_cluster.setup_queues)

    # a pod that ends well on SIGTERM: its group is finished, the pod is let go
    kubectl(
        "apply", "-f", "-", stdin=GROUP_POD % dict(name="a-0", group="a", code=EXIT_0_ON_SIGTERM)
    )
    until(lambda: _running(kubectl, "a-0"), "pod a-0 running")
    assert kubectl("delete", "pod", "a-0") == 'pod "a-0" deleted\n'
    assert "NotFound" in kubectl.fails("get", "pod", "a-0")

    # a pod that SIGTERM kills (exit 143, Failed): kept, and the group waits for a replacement
    kubectl(
        "apply", "-f", "-", stdin=GROUP_POD % dict(name="b-0", group="b", code=KILLED_BY_SIGTERM)
    )
    until(lambda: _running(kubectl, "b-0"), "pod b-0 running")
    assert kubectl("delete", "pod", "b-0", "--wait=false") == 'pod "b-0" deleted\n'
    until(
        lambda: _condition(_workload(fake_cluster, "b"), "WaitingForReplacementPods") == "True",
        "the group waiting for a replacement pod",
    )
    kept = json.loads(kubectl("get", "pod", "b-0", "-o", "json"))
    assert (kept["status"]["phase"], kept["metadata"]["finalizers"]) == (
        "Failed",
        ["kueue.x-k8s.io/managed"],
    )
    # the replacement comes: the failed pod is let go, and kubectl's wait for it returns
    kubectl(
        "apply", "-f", "-", stdin=GROUP_POD % dict(name="b-1", group="b", code=KILLED_BY_SIGTERM)
    )
    kubectl("wait", "--for=delete", "pod/b-0", "--timeout=60s")
    until(lambda: _running(kubectl, "b-1"), "the replacement b-1 running")

    # a pod marked not retriable in its group: deleting it finishes the group, the pod goes
    kubectl("annotate", "pod", "b-1", "kueue.x-k8s.io/retriable-in-group=false")
    assert kubectl("delete", "pod", "b-1") == 'pod "b-1" deleted\n'
    assert "NotFound" in kubectl.fails("get", "pod", "b-1")
