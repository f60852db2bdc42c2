"""Kubernetes-backend config refused before any request (names, checkpoint place, the
pod_template policy), what the fake apiserver's pod admission refuses, and kernels that pass a
namespace enforcing Pod Security "restricted"."""

from __future__ import annotations

from typing import Any

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue import model
from tests.conftest import KernelspecFactory, Server
from tests.kube.support import kube_spec, labelled, ours, wait_clean

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
PRIVILEGED_SIDECAR = {
    "spec": {
        "containers": [
            {"name": "kernel"},
            {"name": "side", "image": "busybox", "securityContext": {"privileged": True}},
        ]
    }
}


def enforce(cluster: FakeCluster, labels: dict[str, str], namespace: str = "default") -> None:
    body = {"metadata": {"labels": labels}}
    cluster.store.patch("", "namespaces", None, namespace, body, "application/merge-patch+json")


def requests(cluster: FakeCluster) -> int:
    return sum(cluster.stats.requests.values())


async def failure(server: Server, name: str) -> tuple[str, str]:
    kernel = await server.start(name)

    async def dead() -> bool:
        return (await server.model(kernel))["execution_state"] == "dead"

    await server.wait_for(dead)
    return kernel, str((await server.model(kernel))["reason"])


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            {"queue": "team/gpu"},
            "`queue` is 'team/gpu', which Kubernetes does not accept as a LocalQueue name; use "
            "lower-case letters, digits, '-' and '.', at most 63 characters",
            id="queue-with-a-slash",
        ),
        pytest.param(
            {"park_after": 600, "connect": "pod-ip", "checkpoint": {"claim": "kernel-checkpoints"}},
            "`park_after` is 600 with `connect` 'pod-ip', but a woken kernel comes back on "
            "another pod's IP, where the notebook's open connection does not follow; use "
            "`connect` 'service' (the default) to park kernels, or set park_after to 0",
            id="park-after-with-pod-ip",
        ),
        pytest.param(
            {"namespace": ".."},
            "`namespace` is '..', which Kubernetes does not accept as a namespace name; use "
            "lower-case letters, digits and '-', at most 63 characters",
            id="namespace-dot-dot",
        ),
        pytest.param(
            {"queue": "user-queue\ud800"},
            "`queue` is 'user-queue\\ud800', which is not valid text (a lone surrogate)",
            id="queue-lone-surrogate",
        ),
        pytest.param(
            {"priority_class": "High Priority"},
            "`priority_class` is 'High Priority', which Kubernetes does not accept as a "
            "WorkloadPriorityClass name",
            id="priority-class-with-a-space",
        ),
        pytest.param(
            {"service_account": "kernels/admin"},
            "`service_account` is 'kernels/admin', which Kubernetes does not accept as a "
            "ServiceAccount name",
            id="service-account-with-a-slash",
        ),
        pytest.param(
            {"checkpoint": {"enabled": True, "claim": "../other"}},
            "`checkpoint.claim` is '../other', which Kubernetes does not accept as a "
            "PersistentVolumeClaim name",
            id="claim-dot-dot",
        ),
        pytest.param(
            {"checkpoint": {"enabled": True, "path": "/srv/checkpoints", "claim": "c"}},
            "`checkpoint.path` is a directory of this machine, which a pod cannot reach; on the "
            "kubernetes backend name a PersistentVolumeClaim with `checkpoint.claim`",
            id="path-on-kubernetes",
        ),
        pytest.param(
            {"checkpoint": {"enabled": True, "claim": "c", "grace_seconds": 8}},
            "`checkpoint.grace_seconds` is 8, which leaves no time to save: the launcher stops "
            "the kernel 5 s before the pod's grace period ends, and the save must end 3 s before "
            "that; use 9 or more seconds",
            id="grace-below-the-save-margin",
        ),
        pytest.param(
            {"gpus": True},
            "kernelspec config key 'gpus' must be a whole number such as 1, not true",
            id="gpus-true",
        ),
        pytest.param(
            {"pod_template": PRIVILEGED_SIDECAR},
            "`pod_template.spec.containers[1].securityContext.privileged` is true, which gives "
            "the container the node's devices and every capability. Remove it from the "
            "kernelspec's pod_template; only a server admin can allow it, with "
            "c.PodTemplatePolicy.allowed_exceptions = ['privileged'] in the server's config",
            id="privileged-sidecar",
        ),
        pytest.param(
            {
                "pod_template": {
                    "spec": {
                        "hostNetwork": True,
                        "securityContext": {"runAsUser": 0},
                        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                    }
                }
            },
            "`pod_template.spec.hostNetwork` is true, which puts the kernel on the node's "
            "network; `pod_template.spec.securityContext.runAsUser` is 0, which runs the kernel "
            'as root; `pod_template.spec.volumes[0].hostPath` is {"path": "/"}, which mounts '
            "a directory of the node",
            id="host-network-root-and-host-path",
        ),
        pytest.param(
            {"pod_template": PRIVILEGED_SIDECAR, "allowed_exceptions": ["privileged"]},
            "unknown config key `allowed_exceptions`",
            id="a-kernelspec-granting-itself-an-exception",
        ),
        pytest.param(
            {
                "pod_template": PRIVILEGED_SIDECAR,
                "config": {"PodTemplatePolicy": {"allowed_exceptions": ["privileged"]}},
            },
            "The 'config' trait of a QueuedKernelProvisioner instance expected a Config",
            id="a-kernelspec-passing-server-config",
        ),
    ],
)
async def test_bad_kubernetes_config_is_refused_before_any_request(
    server: Server,
    kernelspec: KernelspecFactory,
    cluster: FakeCluster,
    config: dict[str, Any],
    expected: str,
) -> None:
    before = requests(cluster)
    kernel, reason = await failure(server, kube_spec(kernelspec, **config))
    assert expected in reason
    assert requests(cluster) == before  # not even discovery: nothing was asked or created
    assert labelled(cluster, kernel) == {}


async def test_a_kernel_runs_in_a_namespace_enforcing_restricted(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    enforce(cluster, RESTRICTED)
    assert cluster.kueue is not None
    cluster.kueue.set_quota("cluster-queue", "default-flavor", {"cpu": 8, "memory": "32Gi"})
    kernel = await server.start(kube_spec(kernelspec, gpus=0, pod_group_size=2))
    assert (await server.execute(kernel, "1 + 1"))["data"] == "2"
    assert sorted(labelled(cluster, kernel)["pods"]) == [
        f"{model.group_name(kernel)}-head-0",
        f"{model.group_name(kernel)}-w1-0",
    ]
    await server.shutdown(kernel)
    await wait_clean(server, cluster, kernel)
    assert ours(cluster) == {}


SLEEPER = {
    "name": "side",
    "image": "busybox",
    "command": ["python", "-c", "import time; time.sleep(3600)"],
}


async def test_a_kernel_with_a_sidecar_runs_in_a_namespace_enforcing_restricted(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    enforce(cluster, RESTRICTED)
    template = {"spec": {"containers": [{"name": "kernel"}, SLEEPER]}}
    kernel = await server.start(kube_spec(kernelspec, pod_template=template, startup_timeout=10))
    try:
        assert (await server.execute(kernel, "1 + 1"))["data"] == "2"
    finally:
        await server.shutdown(kernel)
        await wait_clean(server, cluster, kernel)


async def test_a_missing_service_account_is_the_clusters_refusal_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    kernel, reason = await failure(server, kube_spec(kernelspec, service_account="kernels"))
    assert (
        'error looking up service account default/kernels: serviceaccount "kernels" not found; '
        "the kernelspec's `service_account` 'kernels' does not exist in namespace 'default': "
        "create it (`kubectl create serviceaccount kernels -n default`) or fix "
        "`service_account` in the kernelspec"
    ) in reason
    await wait_clean(server, cluster, kernel)
    assert ours(cluster) == {}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    jp_server_config["PodTemplatePolicy"] = {"allowed_exceptions": ["hostIPC"]}
    return jp_server_config


HOST_IPC = {"spec": {"hostIPC": True}}


async def test_an_exception_the_admin_allows_reaches_the_pod(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    kernel = await server.start(kube_spec(kernelspec, pod_template=HOST_IPC))
    assert (await server.execute(kernel, "1"))["data"] == "1"
    pods, _ = cluster.store.list_objects(
        "", "pods", "default", labels=f"kernel-queue.dev/kernel-id={kernel}"
    )
    assert [p["spec"].get("hostIPC") for p in pods] == [True]
    await server.shutdown(kernel)
    await wait_clean(server, cluster, kernel)


async def test_an_allowed_exception_still_meets_a_restricted_namespace(
    server: Server, kernelspec: KernelspecFactory, cluster: FakeCluster
) -> None:
    enforce(cluster, RESTRICTED)
    kernel, reason = await failure(server, kube_spec(kernelspec, pod_template=HOST_IPC))
    assert 'violates PodSecurity "restricted:latest": host namespaces (hostIPC=true)' in reason
    await wait_clean(server, cluster, kernel)
    assert ours(cluster) == {}


async def test_an_exception_that_is_no_rule_is_refused_naming_the_setting(
    server: Server,
    kernelspec: KernelspecFactory,
    cluster: FakeCluster,
    jp_server_config: dict[str, Any],
) -> None:
    server.app.config.PodTemplatePolicy.allowed_exceptions = ["hostIPC", "priviledged"]
    kernel, reason = await failure(server, kube_spec(kernelspec, pod_template=HOST_IPC))
    assert reason.endswith(
        "c.PodTemplatePolicy.allowed_exceptions lists 'priviledged', which is neither a rule "
        "(did you mean 'privileged'?) nor a field path such as 'spec.volumes[*].hostPath'; fix "
        "the server's config"
    )
    assert labelled(cluster, kernel) == {}
