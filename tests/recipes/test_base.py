"""etc/kubernetes/base: the RBAC the kubernetes backend needs in a namespace, its LocalQueue, the
checkpoint claim and the kernels' NetworkPolicy; rendered by kubectl, checked against
Kubernetes' and Kueue's schemas, applied with kubectl, and read for what it lets through."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from kernel_queue.kube.objects import manifests
from tests.recipes import network, rendering
from tests.recipes.conftest import kernel_pods, kubectl_apply, start_cluster, stop_cluster

BACKEND_RULES = [
    # (API group, resource, verbs): what kernel_queue/kube and backends/kubernetes/backend.py call
    ("", "pods", ["create", "get", "list", "watch", "delete"]),  # the group; one shared watch
    ("", "pods/log", ["get"]),  # the last lines of a kernel that failed
    ("", "secrets", ["create", "get", "list", "delete"]),  # the key; get on a 409, list: reaper
    ("", "services", ["create", "get", "list", "delete"]),  # the kernel's address
    ("", "configmaps", ["create", "get", "list", "delete"]),  # the launcher; list: reaper
    ("", "persistentvolumeclaims", ["get"]),  # preflight: the checkpoint claim exists
    ("kueue.x-k8s.io", "workloads", ["list", "watch", "patch", "delete"]),  # state; park; release
    ("kueue.x-k8s.io", "localqueues", ["get", "list"]),  # preflight: the queue (else: which)
    ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", ["get"]),  # positions
]
"""The Role: exactly these verbs, in the namespace of the kernels."""
CLUSTER_RULES = [("kueue.x-k8s.io", "workloadpriorityclasses", ["get"])]
"""The ClusterRole: preflight reads the kernelspec's WorkloadPriorityClass (cluster-scoped)."""


def rules(role: dict) -> list[tuple[str, str, list[str]]]:
    return [
        (group, resource, rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    ]


def test_the_base_renders_and_every_object_passes_its_schema() -> None:
    objects = rendering.rendered("base")
    assert rendering.kinds_and_names(objects) == rendering.with_base(None)
    for obj in objects:
        rendering.validate(obj)


def test_the_role_grants_exactly_the_verbs_the_backend_uses() -> None:
    objects = rendering.rendered("base")
    (role,) = rendering.of_kind(objects, "Role")
    assert rules(role) == BACKEND_RULES
    (cluster_role,) = rendering.of_kind(objects, "ClusterRole")
    assert rules(cluster_role) == CLUSTER_RULES


def test_the_checkpoint_claim_is_read_write_many() -> None:
    (claim,) = rendering.of_kind(rendering.rendered("base"), "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_etc_kubernetes_rbac_yaml_is_the_base_s_rbac() -> None:
    """tests/kube, the README and the backend's RBAC sentence name etc/kubernetes/rbac.yaml: it
    stays, as a link to the base's file, so there is one list of verbs."""
    link = rendering.RECIPES / "rbac.yaml"
    assert os.readlink(link) == "base/rbac.yaml"
    plain = list(yaml.safe_load_all(link.read_text()))
    assert len(plain) == 5
    assert [o for o in plain if o not in rendering.rendered("base")] == []


def test_only_the_server_reaches_the_kernel_ports_and_a_group_its_other_ports() -> None:
    (policy,) = rendering.of_kind(rendering.rendered("base"), "NetworkPolicy")
    head, worker = (network.Pod.of(p) for p in kernel_pods("default"))
    server = network.Pod("default", {"app": "jupyterlab", "kernel-queue.dev/server": "true"})
    stranger = network.Pod("default", {"app": "jupyterlab"})
    elsewhere = network.Pod("other", {"kernel-queue.dev/server": "true"})
    for port in manifests.KERNEL_PORTS.values():
        assert network.ingress_allowed([policy], server, head, port)
        assert not network.ingress_allowed([policy], stranger, head, port)
        assert not network.ingress_allowed([policy], elsewhere, head, port)
        assert not network.ingress_allowed([policy], worker, head, port)  # nor another kernel
    assert network.ingress_allowed([policy], worker, head, 29500)  # torch.distributed's port
    assert network.ingress_allowed([policy], head, worker, 29500)
    assert not network.ingress_allowed([policy], server, head, 29500)
    assert not network.ingress_allowed([policy], stranger, worker, 29500)
    assert not network.ingress_allowed([policy], server, head, 50100, "UDP")


def test_kubectl_applies_the_base_as_an_admin_and_a_second_apply_changes_nothing(
    module_root: Path,
) -> None:
    cluster = start_cluster(module_root / "base", {})
    try:
        text = rendering.as_yaml(rendering.rendered("base"))
        first = kubectl_apply(cluster, text)
        assert len(first) == len(rendering.rendered("base")), first
        # queues.yaml, applied with the cluster, made the same LocalQueue in `default` already
        assert [line for line in first if not line.endswith(" created")] == [
            "localqueue.kueue.x-k8s.io/user-queue configured"
        ]
        again = kubectl_apply(cluster, text)
        assert all(line.endswith(" unchanged") for line in again), again
    finally:
        stop_cluster(cluster)
