"""The fake cluster as a kubectl user meets it: `kubectl create` of built-in kinds (sent as
protobuf), Secrets' `stringData`, `kubectl apply` with validation on, server-side printing,
Nodes, and deleting an admitted group's pod."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import kubernetes.config
import kubernetes.watch
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


def test_kubectl_creates_services_service_accounts_and_rbac(
    kubectl: Kubectl, fake_cluster: FakeCluster
) -> None:
    kubectl("create", "service", "clusterip", "web", "--tcp=80:8080")
    service = _get(fake_cluster, "services", "default", "web")
    assert (service["spec"]["type"], service["spec"]["ports"]) == (
        "ClusterIP",
        [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
    )
    assert service["spec"]["selector"] == {"app": "web"}
    kubectl("create", "serviceaccount", "robot")
    assert _get(fake_cluster, "serviceaccounts", "default", "robot")["metadata"]["name"] == "robot"
    kubectl("create", "role", "reader", "--verb=get,list", "--resource=pods")
    kubectl(
        "create", "rolebinding", "robot-reads", "--role=reader", "--serviceaccount=default:robot"
    )
    role = fake_cluster.call(
        fake_cluster.store.get, "rbac.authorization.k8s.io", "roles", "default", "reader"
    )
    assert role["rules"] == [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}]
    binding = fake_cluster.call(
        fake_cluster.store.get,
        "rbac.authorization.k8s.io",
        "rolebindings",
        "default",
        "robot-reads",
    )
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "reader",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "robot", "namespace": "default"}
    ]


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


def test_kubectl_apply_with_validate_warn_warns_of_an_unknown_field(kubectl: Kubectl) -> None:
    done = kubectl.run("apply", "--validate=warn", "-f", "-", stdin=POD % ("python", "foo: 1"))
    assert (done.returncode, done.stdout) == (0, "pod/p created\n")
    assert 'Warning: unknown field "spec.foo"' in done.stderr


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


# -- Nodes ------------------------------------------------------------------------------------


def test_the_fake_node_is_a_node_object_kubectl_and_clients_read(
    kubectl: Kubectl, fake_cluster: FakeCluster
) -> None:
    assert "fake-node" in kubectl("get", "nodes")
    node = json.loads(kubectl("get", "node", "fake-node", "-o", "json"))
    status = node["status"]
    assert status["capacity"]["nvidia.com/gpu"] == status["allocatable"]["nvidia.com/gpu"] == "8"
    assert int(status["capacity"]["cpu"]) >= 1
    assert {"type": "InternalIP", "address": "127.0.0.1"} in status["addresses"]
    ready = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert [(c["status"], c["reason"]) for c in ready] == [("True", "KubeletReady")]

    api = kubernetes.config.new_client_from_config(config_file=str(fake_cluster.kubeconfig))
    core = kubernetes.client.CoreV1Api(api)
    listed = core.list_node()
    assert [n.metadata.name for n in listed.items] == ["fake-node"]
    stream = kubernetes.watch.Watch().stream(core.list_node, timeout_seconds=1)
    assert [(e["type"], e["object"].metadata.name) for e in stream] == [("ADDED", "fake-node")]


# -- server-side printing: kubectl get's columns -----------------------------------------------

PLAIN_POD = """
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: main
    image: python
    command: [python, -c, "import time; time.sleep(600)"]
"""
SERVICE = """
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"""
CLAIM = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteMany]
  volumeMode: Filesystem
  resources: {requests: {storage: 1Gi}}
"""


def _table(text: str) -> list[list[str]]:
    """kubectl's columns: cells are at least two spaces apart (one space may sit inside)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


def test_kubectl_get_shows_a_real_clusters_columns(
    kubectl: Kubectl, fake_cluster: FakeCluster
) -> None:
    kubectl("apply", "-f", "-", stdin=PLAIN_POD)
    kubectl("apply", "-f", "-", stdin=SERVICE)
    until(lambda: _table(kubectl("get", "pods"))[1][1:3] == ["1/1", "Running"], "web ready")

    header, row = _table(kubectl("get", "pods"))
    assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row[:4] == ["web", "1/1", "Running", "0"]
    with kubectl.watch("get", "pods", "-w") as watcher:
        try:
            assert watcher.stdout is not None
            lines = watcher.stdout
            assert _table(lines.readline()) == [["NAME", "READY", "STATUS", "RESTARTS", "AGE"]]
            assert _table(lines.readline())[0][:3] == ["web", "1/1", "Running"]
            kubectl("label", "pod", "web", "seen=yes")  # a watch event, printed as a row
            assert _table(lines.readline())[0][:3] == ["web", "1/1", "Running"]
        finally:
            watcher.kill()
    header, row = _table(kubectl("get", "pods", "-o", "wide"))
    assert header == [
        "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED NODE",
        "READINESS GATES",
    ]  # fmt: skip
    pod = _get(fake_cluster, "pods", "default", "web")
    assert row[5:] == [pod["status"]["podIP"], "fake-node", "<none>", "<none>"]

    header, row = _table(kubectl("get", "services", "web"))
    assert header == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
    service = _get(fake_cluster, "services", "default", "web")
    assert row[:5] == ["web", "ClusterIP", service["spec"]["clusterIP"], "<none>", "80/TCP"]
    assert _table(kubectl("get", "services", "web", "-o", "wide"))[1][-1] == "app=web"

    kubectl("create", "secret", "generic", "s", "--from-literal=a=b", "--from-literal=c=d")
    header, row = _table(kubectl("get", "secret", "s"))
    assert (header, row[:3]) == (["NAME", "TYPE", "DATA", "AGE"], ["s", "Opaque", "2"])
    kubectl("create", "configmap", "c", "--from-literal=a=b")
    header, row = _table(kubectl("get", "configmap", "c"))
    assert (header, row[:2]) == (["NAME", "DATA", "AGE"], ["c", "1"])
    header, row = _table(kubectl("get", "namespace", "default"))
    assert (header, row[:2]) == (["NAME", "STATUS", "AGE"], ["default", "Active"])

    rows = _table(kubectl("get", "events", "--field-selector=involvedObject.name=web"))
    assert rows[0] == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert ["Normal", "Started", "pod/web", "Started container main"] in [r[1:] for r in rows]
    kubectl("create", "serviceaccount", "robot")
    header, row = _table(kubectl("get", "serviceaccount", "robot"))
    assert (header, row[:2]) == (["NAME", "SECRETS", "AGE"], ["robot", "0"])
    kubectl("apply", "-f", "-", stdin=CLAIM)
    header, row = _table(kubectl("get", "pvc", "data", "-o", "wide"))
    assert header == [
        "NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS",
        "VOLUMEATTRIBUTESCLASS", "AGE", "VOLUMEMODE",
    ]  # fmt: skip
    assert (row[:2], row[-1]) == (["data", "Bound"], "Filesystem")  # no class: bound at once
    assert row[2].startswith("pvc-") and {"1Gi", "RWX", "<unset>"} <= set(row)

    header, row = _table(kubectl("get", "nodes"))
    assert header == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert (row[:3], row[4]) == (["fake-node", "Ready", "<none>"], "v1.32.0-fake")
    header, row = _table(kubectl("get", "nodes", "-o", "wide"))
    assert header[5:] == ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION",
                          "CONTAINER-RUNTIME"]  # fmt: skip
    assert row[5:7] == ["127.0.0.1", "<none>"]


def test_kubectl_get_shows_the_crds_printer_columns(
    kubectl: Kubectl, fake_cluster: FakeCluster
) -> None:
    fake_cluster.call(fake_cluster.setup_queues)
    kubectl(
        "apply", "-f", "-", stdin=GROUP_POD % dict(name="a-0", group="a", code=KILLED_BY_SIGTERM)
    )
    until(lambda: _condition(_workload(fake_cluster, "a"), "Admitted") == "True", "a admitted")

    header, row = _table(kubectl("get", "workloads"))
    assert header == ["NAME", "QUEUE", "RESERVED IN", "ADMITTED", "FINISHED", "AGE"]
    assert row[:4] == ["a", "user-queue", "cluster-queue", "True"]
    header, row = _table(kubectl("get", "localqueues"))
    assert header == ["NAME", "CLUSTERQUEUE", "PENDING WORKLOADS", "ADMITTED WORKLOADS"]
    assert row[:2] == ["user-queue", "cluster-queue"]
    assert _table(kubectl("get", "clusterqueues", "-o", "wide"))[0] == [
        "NAME", "COHORT", "STRATEGY", "PENDING WORKLOADS", "ADMITTED WORKLOADS"
    ]  # fmt: skip
    assert _table(kubectl("get", "resourceflavors"))[0] == ["NAME", "AGE"]


def test_kubectl_get_all_lists_pods_and_services(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=PLAIN_POD)
    kubectl("apply", "-f", "-", stdin=SERVICE)
    shown = kubectl("get", "all")
    assert "pod/web" in shown and "service/web" in shown
