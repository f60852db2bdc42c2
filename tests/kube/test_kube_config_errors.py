"""Kubernetes-backend config refused before any request (names, checkpoint place, the
pod_template policy), and what the API server's pod admission refuses: kernels pass a namespace
enforcing Pod Security "restricted", and an exception the admin allows still meets it. The
restricted-namespace tests run on both planes, so the real API server's own Pod Security
admission judges our pods too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue import model
from tests.conftest import KernelspecFactory, Server
from tests.kube.planes import Plane
from tests.kube.support import failure, kube_spec, labelled, ours, wait_clean

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
PRIVILEGED_SIDECAR = {
    "spec": {
        "containers": [
            {"name": "kernel"},
            {"name": "side", "image": "busybox", "securityContext": {"privileged": True}},
        ]
    }
}


@pytest.fixture
def restricted(plane: Plane) -> Iterator[None]:
    """Namespace default of the test's plane enforcing Pod Security "restricted" (its label),
    taken off again after the test: the real plane's namespace default outlives the test."""
    plane.merge_patch("", "namespaces", None, "default", {"metadata": {"labels": RESTRICTED}})
    yield
    unlabelled = {"metadata": {"labels": dict.fromkeys(RESTRICTED)}}
    plane.merge_patch("", "namespaces", None, "default", unlabelled)


def requests(cluster: FakeCluster) -> int:
    return sum(cluster.stats.requests.values())


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
            {"pod_group_size": 2, "worker_command": "dask worker tcp://$(MASTER_ADDR):8786"},
            "kernelspec config key 'worker_command' must be a list of strings, one per word, such "
            'as ["dask", "worker", "tcp://$(MASTER_ADDR):8786"], not '
            "'dask worker tcp://$(MASTER_ADDR):8786' (a string)",
            id="worker-command-a-string",
        ),
        pytest.param(
            {"worker_command": ["dask", "worker"]},
            '`worker_command` is ["dask", "worker"], but `pod_group_size` is 1: a kernel of one '
            "pod has no worker to run it; set `pod_group_size` to 2 or more, or leave "
            "`worker_command` out",
            id="worker-command-without-workers",
        ),
        pytest.param(
            {"pod_group_size": 2, "worker_command": ["", "worker"]},
            '`worker_command` is ["", "worker"], whose first word (the program) is empty; name '
            'the program first, such as ["dask", "worker", "tcp://$(MASTER_ADDR):8786"]',
            id="worker-command-without-a-program",
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
    # the fake only: refused before any request, no API server has anything to judge
    before = requests(cluster)
    kernel, reason = await failure(server, kube_spec(kernelspec, **config))
    assert expected in reason
    assert requests(cluster) == before  # not even discovery: nothing was asked or created
    assert labelled(cluster, kernel) == {}


@pytest.mark.usefixtures("restricted")
async def test_a_kernel_runs_in_a_namespace_enforcing_restricted(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    plane.set_quota("cluster-queue", "default-flavor", {"cpu": 8, "memory": "32Gi"})
    kernel = await server.start(kube_spec(kernelspec, gpus=0, pod_group_size=2))
    assert (await server.execute(kernel, "1 + 1"))["data"] == "2"
    assert sorted(labelled(plane, kernel)["pods"]) == [
        f"{model.group_name(kernel)}-head-0",
        f"{model.group_name(kernel)}-w1-0",
    ]
    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)
    assert ours(plane) == {}


SLEEPER = {
    "name": "side",
    "image": "busybox",
    "command": ["python", "-c", "import time; time.sleep(3600)"],
}


@pytest.mark.usefixtures("restricted")
async def test_a_kernel_with_a_sidecar_runs_in_a_namespace_enforcing_restricted(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    template = {"spec": {"containers": [{"name": "kernel"}, SLEEPER]}}
    kernel = await server.start(kube_spec(kernelspec, pod_template=template, startup_timeout=10))
    try:
        assert (await server.execute(kernel, "1 + 1"))["data"] == "2"
    finally:
        await server.shutdown(kernel)
        await wait_clean(server, plane, kernel)


async def test_a_missing_service_account_is_the_clusters_refusal_and_leaves_nothing(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    kernel, reason = await failure(server, kube_spec(kernelspec, service_account="kernels"))
    assert (
        'error looking up service account default/kernels: serviceaccount "kernels" not found; '
        "the kernelspec's `service_account` 'kernels' does not exist in namespace 'default': "
        "create it (`kubectl create serviceaccount kernels -n default`) or fix "
        "`service_account` in the kernelspec"
    ) in reason
    await wait_clean(server, plane, kernel)
    assert ours(plane) == {}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    jp_server_config["PodTemplatePolicy"] = {"allowed_exceptions": ["hostIPC"]}
    return jp_server_config


HOST_IPC = {"spec": {"hostIPC": True}}


async def test_an_exception_the_admin_allows_reaches_the_pod(
    server: Server, kernelspec: KernelspecFactory, plane: Plane
) -> None:
    kernel = await server.start_running(kube_spec(kernelspec, pod_template=HOST_IPC))
    pods = plane.objects("", "pods", "default", f"kernel-queue.dev/kernel-id={kernel}")
    assert [p["spec"].get("hostIPC") for p in pods] == [True]
    await server.shutdown(kernel)
    await wait_clean(server, plane, kernel)


@pytest.mark.parametrize(
    ("allowed", "template", "refused"),
    [
        pytest.param(["hostIPC"], HOST_IPC, "host namespaces (hostIPC=true)", id="hostIPC"),
        pytest.param(
            ["hostNetwork"],
            {"spec": {"hostNetwork": True}},
            # on the node's network the API server makes each container port a host port
            'host namespaces (hostNetwork=true), hostPort (container "kernel" uses hostPorts '
            "50100, 50101, 50102, 50103, 50104)",
            id="hostNetwork",
        ),
        pytest.param(
            ["runAsUser"],
            {"spec": {"securityContext": {"runAsUser": 0}}},
            "runAsUser=0 (pod must not set runAsUser=0)",
            id="runAsUser-0",
        ),
        pytest.param(
            ["hostPath", "volumeTypes"],
            {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
            'restricted volume types (volume "root" uses restricted volume type "hostPath")',
            id="hostPath",
        ),
        pytest.param(
            ["privileged"],
            PRIVILEGED_SIDECAR,
            'privileged (container "side" must not set securityContext.privileged=true)',
            id="privileged",
        ),
    ],
)
@pytest.mark.usefixtures("restricted")
async def test_an_allowed_exception_still_meets_a_restricted_namespace(
    server: Server,
    kernelspec: KernelspecFactory,
    plane: Plane,
    allowed: list[str],
    template: dict[str, Any],
    refused: str,
) -> None:
    """What the pod_template policy refuses, allowed by the admin, reaches the API server, whose
    Pod Security admission refuses it in the restricted namespace: the policy is no looser."""
    server.app.config.PodTemplatePolicy.allowed_exceptions = allowed
    kernel, reason = await failure(server, kube_spec(kernelspec, pod_template=template))
    assert 'is forbidden: violates PodSecurity "restricted:latest": ' in reason, reason
    assert refused in reason, reason
    await wait_clean(server, plane, kernel)
    assert ours(plane) == {}


async def test_an_exception_that_is_no_rule_is_refused_naming_the_setting(
    server: Server,
    kernelspec: KernelspecFactory,
    cluster: FakeCluster,
    jp_server_config: dict[str, Any],
) -> None:
    # the fake only: refused before any request, no API server has anything to judge
    server.app.config.PodTemplatePolicy.allowed_exceptions = ["hostIPC", "priviledged"]
    kernel, reason = await failure(server, kube_spec(kernelspec, pod_template=HOST_IPC))
    assert reason.endswith(
        "c.PodTemplatePolicy.allowed_exceptions lists 'priviledged', which is neither a rule "
        "(did you mean 'privileged'?) nor a field path such as 'spec.volumes[*].hostPath'; fix "
        "the server's config"
    )
    assert labelled(cluster, kernel) == {}
