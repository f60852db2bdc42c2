"""etc/kubernetes/kubeflow: JupyterLab as a Kubeflow Notebook in a profile namespace, its
kernelspecs from a ConfigMap, the backend's verbs granted to `default-editor`. Rendered and
validated, applied with kubectl, then a kernel-queue server holding only `default-editor`'s
token runs a queued kernel end to end on the fake cluster, which enforces RBAC; a Role short of
one verb fails the kernel with that verb named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue.kube.objects import manifests
from tests.conftest import Server
from tests.recipes import network, rendering
from tests.recipes.conftest import (
    FIXTURES,
    failed_for_want_of_creating_services,
    kubectl_apply,
    labelled_in,
    lay_out_config_maps,
    namespace,
    recipe_cluster,
    served_with,
    shut_down_leaving_nothing,
    under,
)

NAMESPACE = "kubeflow-user-example-com"
EDITOR = f"system:serviceaccount:{NAMESPACE}:default-editor"
EDITOR_TOKEN = "default-editor-token"
KERNELSPEC = "python3-gpu-queued"
APPLIED: list[str] = []
"""What `kubectl apply` said when the module's cluster got the overlay."""


def objects() -> tuple[rendering.Obj, ...]:
    return rendering.rendered("kubeflow")  # see rendering.rendered


PROFILE = [
    namespace(NAMESPACE),
    {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "default-editor", "namespace": NAMESPACE},
    },
]
"""What Kubeflow's profile controller makes for a profile: its namespace and the service
account `default-editor` there."""


@pytest.fixture(scope="module")
def cluster(module_root: Path) -> Iterator[FakeCluster]:
    """One RBAC-enforcing cluster for the module, the overlay applied by an admin with
    kubectl (what it said in `APPLIED`)."""
    root, accounts = module_root / "rbac", {EDITOR_TOKEN: EDITOR}
    with recipe_cluster(root, accounts, objects(), APPLIED, made_first=PROFILE) as fake:
        yield fake


def test_the_overlay_renders_and_every_object_passes_its_schema() -> None:
    assert rendering.kinds_and_names(objects()) == rendering.with_base(
        NAMESPACE, ("ConfigMap", "kernel-queue-kernelspecs"), ("Notebook", "lab"), account=False
    )
    assert {o["metadata"].get("namespace", NAMESPACE) for o in objects()} == {NAMESPACE}
    for obj in objects():
        rendering.validate(obj)


def test_default_editor_is_bound_to_the_base_s_verbs() -> None:
    editor = [{"kind": "ServiceAccount", "name": "default-editor", "namespace": NAMESPACE}]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        (binding,) = rendering.of_kind(objects(), kind)
        assert binding["subjects"] == editor
    (role,) = rendering.of_kind(objects(), "Role")
    (base_role,) = rendering.of_kind(rendering.rendered("base"), "Role")
    assert role["rules"] == base_role["rules"]


def test_kubectl_applies_the_overlay(cluster: FakeCluster) -> None:
    # The fake serves Notebooks through a test-only CRD (tests/recipes/fixtures).
    assert (FIXTURES / "notebooks.kubeflow.org.yaml").is_file()
    assert len(APPLIED) == len(objects()), APPLIED
    assert all(line.endswith(" created") for line in APPLIED), APPLIED
    assert "notebook.kubeflow.org/lab created" in APPLIED
    assert "configmap/kernel-queue-kernelspecs created" in APPLIED
    again = kubectl_apply(cluster, rendering.as_yaml(objects()))
    assert all(line.endswith(" unchanged") for line in again), again


def notebook_files(root: Path) -> dict[str, str]:
    """The files the Notebook's pod sees from its ConfigMaps, under `root`; its environment."""
    (notebook,) = rendering.of_kind(objects(), "Notebook")
    pod = notebook["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return lay_out_config_maps(objects(), pod, container, root)


@pytest.fixture
def jp_server_config(
    jp_server_config: dict[str, Any],
    cluster: FakeCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, Any]:
    """The server as the Notebook's pod runs it: kernelspecs where JUPYTER_PATH points, the
    namespace its service account's (KERNEL_QUEUE_NAMESPACE stands in for the pod's namespace
    file), credentials that are `default-editor`'s token and nothing else."""
    root = tmp_path / "notebook-pod"
    env = notebook_files(root)
    monkeypatch.setenv("JUPYTER_PATH", str(under(root, env["JUPYTER_PATH"])))
    monkeypatch.setenv("KERNEL_QUEUE_NAMESPACE", NAMESPACE)
    kubeconfig = cluster.kubeconfig_for(EDITOR_TOKEN, namespace=NAMESPACE, name="editor")
    return served_with(jp_server_config, kubeconfig, "lab-0")


async def test_a_queued_kernel_runs_with_only_default_editor_s_token(
    server: Server, cluster: FakeCluster
) -> None:
    specs = json.loads((await server.fetch("api", "kernelspecs", method="GET")).body)
    assert specs["kernelspecs"][KERNELSPEC]["spec"]["display_name"] == "Python 3 (1 GPU, queued)"
    kernel = await server.start(KERNELSPEC)
    result = await server.execute(kernel, f"import os; os.environ['KERNEL_ID'] == {kernel!r}")
    assert result["data"] == "True"
    made = labelled_in(cluster, NAMESPACE, kernel)
    assert sorted(made) == ["pods", "secrets", "services", "workloads"]
    pods, _ = cluster.call(
        cluster.store.list_objects,
        "",
        "pods",
        NAMESPACE,
        labels=f"kernel-queue.dev/kernel-id={kernel}",
    )
    (head,) = pods
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in head["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["kernel-checkpoints"]
    assert head["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    # The Notebook's pod (its labels as the notebook controller sets them) may reach the
    # kernel's ports; another pod of the profile may not.
    (policy,) = rendering.of_kind(objects(), "NetworkPolicy")
    (notebook,) = rendering.of_kind(objects(), "Notebook")
    lab = {**notebook["metadata"]["labels"], "notebook-name": "lab", "statefulset": "lab"}
    target = network.Pod.of(head)
    for port in manifests.KERNEL_PORTS.values():
        assert network.ingress_allowed([policy], network.Pod(NAMESPACE, lab), target, port)
        other = {"notebook-name": "other", "statefulset": "other"}
        assert not network.ingress_allowed([policy], network.Pod(NAMESPACE, other), target, port)
    await shut_down_leaving_nothing(server, kernel, lambda: labelled_in(cluster, NAMESPACE, kernel))


async def test_a_role_short_of_one_verb_fails_the_kernel_naming_the_verb_and_resource(
    server: Server, cluster: FakeCluster
) -> None:
    (role,) = rendering.of_kind(objects(), "Role")
    trimmed = json.loads(json.dumps(role))
    (services,) = [r for r in trimmed["rules"] if r["resources"] == ["services"]]
    services["verbs"].remove("create")
    assert kubectl_apply(cluster, rendering.as_yaml([trimmed])) == [
        "role.rbac.authorization.k8s.io/kernel-queue configured"
    ]
    try:
        kernel = await server.start(KERNELSPEC)

        async def dead() -> bool:
            return (await server.model(kernel))["execution_state"] == "dead"

        await server.wait_for(dead)
        reason = (await server.model(kernel))["reason"]
    finally:
        kubectl_apply(cluster, rendering.as_yaml([role]))
    await failed_for_want_of_creating_services(
        server,
        kernel,
        reason,
        f"{NAMESPACE}/default-editor",
        lambda: labelled_in(cluster, NAMESPACE, kernel),
    )
