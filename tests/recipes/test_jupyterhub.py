"""etc/kubernetes/jupyterhub: kernel-queue for zero-to-jupyterhub's user servers. The
kustomization (the base in the hub's namespace, one account for every user server) rendered,
validated and applied with kubectl; the chart values (values.yaml) read as the chart uses them:
the user pod's labels, its kernelspec and server config files, and the egress rules of its
NetworkPolicy, which open the kernels' ports and nothing else private; then a user server with
only the account's token runs a queued kernel end to end on the RBAC-enforcing fake cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue.kube.objects import manifests
from tests.conftest import Server
from tests.recipes import network, rendering
from tests.recipes.conftest import (
    ALL_OF_A_KERNEL,
    kernel_pods,
    labelled_in,
    namespace,
    recipe_cluster,
    served_with,
    shut_down_leaving_nothing,
)

NAMESPACE = "jupyterhub"
ACCOUNT = f"system:serviceaccount:{NAMESPACE}:kernel-queue"
ACCOUNT_TOKEN = "kernel-queue-user-server-token"
APPLIED: list[str] = []
"""What `kubectl apply` said when the module's cluster got the kustomization."""


def objects() -> tuple[rendering.Obj, ...]:
    return rendering.rendered("jupyterhub")  # see rendering.rendered


VALUES = yaml.safe_load((rendering.RECIPES / "jupyterhub" / "values.yaml").read_text())
SINGLEUSER = VALUES["singleuser"]
USER_POD_LABELS = {
    # what KubeSpawner, as the chart configures it, puts on a user's pod
    "app": "jupyterhub",
    "component": "singleuser-server",
    "release": "jupyterhub",
    "hub.jupyter.org/network-access-hub": "true",
    "hub.jupyter.org/username": "alice",
    **SINGLEUSER["extraLabels"],
}


@pytest.fixture(scope="module")
def cluster(module_root: Path) -> Iterator[FakeCluster]:
    """The RBAC-enforcing cluster of the module, the kustomization applied by an admin with
    kubectl (what it said in `APPLIED`)."""
    accounts, hub = {ACCOUNT_TOKEN: ACCOUNT}, [namespace(NAMESPACE)]
    with recipe_cluster(module_root / "rbac", accounts, objects(), APPLIED, made_first=hub) as fake:
        yield fake


def test_the_kustomization_renders_and_every_object_passes_its_schema() -> None:
    assert rendering.kinds_and_names(objects()) == rendering.with_base(NAMESPACE)
    assert {o["metadata"].get("namespace", NAMESPACE) for o in objects()} == {NAMESPACE}
    for obj in objects():
        rendering.validate(obj)
    (account,) = rendering.of_kind(objects(), "ServiceAccount")
    assert SINGLEUSER["serviceAccountName"] == account["metadata"]["name"]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        (binding,) = rendering.of_kind(objects(), kind)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "kernel-queue", "namespace": NAMESPACE}
        ]


def test_kubectl_applies_the_kustomization(cluster: FakeCluster) -> None:
    assert len(APPLIED) == len(objects()), APPLIED
    assert all(line.endswith(" created") for line in APPLIED), APPLIED
    assert "serviceaccount/kernel-queue created" in APPLIED


def egress_policy() -> dict[str, Any]:
    """The chart's singleuser NetworkPolicy as far as these values make it: their egress rules."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "singleuser", "namespace": NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"component": "singleuser-server"}},
            "policyTypes": ["Egress"],
            "egress": SINGLEUSER["networkPolicy"]["egress"],
        },
    }


def test_a_user_server_may_reach_exactly_the_kernel_ports_of_the_private_network() -> None:
    rendering.validate_core(egress_policy())
    assert SINGLEUSER["networkPolicy"]["egressAllowRules"] == {"privateIPs": False}
    rules = SINGLEUSER["networkPolicy"]["egress"]
    head, worker = (network.Pod.of(p) for p in kernel_pods(NAMESPACE))
    database = network.Pod(NAMESPACE, {"app": "postgres"})
    hub = network.Pod(NAMESPACE, {"app": "jupyterhub", "component": "hub"})
    for port in manifests.KERNEL_PORTS.values():
        assert network.egress_allowed(rules, NAMESPACE, head, port)
        assert not network.egress_allowed(rules, NAMESPACE, database, port)
        assert not network.egress_allowed(rules, NAMESPACE, hub, port)
    assert not network.egress_allowed(rules, NAMESPACE, worker, 29500)
    assert not network.egress_allowed(rules, NAMESPACE, database, 5432)
    # ... and the kernels' own policy lets the user's pod in.
    (policy,) = rendering.of_kind(objects(), "NetworkPolicy")
    user = network.Pod(NAMESPACE, USER_POD_LABELS)
    assert network.ingress_allowed([policy], user, head, manifests.KERNEL_PORTS["shell"])


def user_pod_files(root: Path) -> None:
    """Lay out the files the chart mounts from `singleuser.extraFiles` under `root` (a .json
    mountPath gets `data` written as JSON)."""
    for entry in SINGLEUSER["extraFiles"].values():
        target = root / entry["mountPath"].lstrip("/")
        assert target.suffix == ".json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(entry["data"]))


@pytest.fixture
def jp_server_config(
    jp_server_config: dict[str, Any],
    cluster: FakeCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, Any]:
    """A user's server as the chart starts it: its extraFiles laid out, its extraEnv set, the
    server config file loaded, and only the account's token as credentials."""
    root = tmp_path / "user-pod"
    user_pod_files(root)
    for name, value in SINGLEUSER["extraEnv"].items():
        monkeypatch.setenv(name, str(root / value.lstrip("/")) if name == "JUPYTER_PATH" else value)
    config_file = root / "etc/jupyter/jupyter_server_config.d/kernel-queue-backend.json"
    backend = json.loads(config_file.read_text())["KubernetesBackend"]
    kubeconfig = cluster.kubeconfig_for(ACCOUNT_TOKEN, namespace=NAMESPACE, name="user")
    return served_with(jp_server_config, kubeconfig, "jupyter-alice", **backend)


async def test_a_user_server_runs_a_queued_kernel_with_the_account_s_token(
    server: Server, cluster: FakeCluster
) -> None:
    kernel = await server.start("python3-gpu-queued")
    result = await server.execute(kernel, "6 * 7")
    assert result["data"] == "42", result
    assert sorted(labelled_in(cluster, NAMESPACE, kernel)) == ALL_OF_A_KERNEL
    await shut_down_leaving_nothing(server, kernel, lambda: labelled_in(cluster, NAMESPACE, kernel))
