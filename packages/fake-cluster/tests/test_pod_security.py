"""The fake apiserver's pod admission: Pod Security "restricted"/"baseline" on labelled
namespaces and the ServiceAccount lookup, refused with the Status a real apiserver sends."""

from __future__ import annotations

import asyncio
import copy
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kernel_queue_fake_cluster.apiserver import pod_rules as pods
from kernel_queue_fake_cluster.apiserver import pod_security, resources
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.cluster import FakeCluster

ENFORCE = "pod-security.kubernetes.io/enforce"

HARDENED: Obj = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "secure"},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "kernel",
                "image": "python:3.11",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}}],
    },
}


def with_changes(**spec: Any) -> Obj:
    pod = copy.deepcopy(HARDENED)
    pod["spec"].update(spec)
    return pod


def container(**security: Any) -> Obj:
    base: Obj = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return {"name": "side", "image": "busybox", "securityContext": {**base, **security}}


def label(store: Store, namespace: str, labels: dict[str, str]) -> None:
    body = {"metadata": {"labels": labels}}
    store.patch("", "namespaces", None, namespace, body, "application/merge-patch+json")


@pytest.fixture
def store() -> Iterator[Store]:
    found = Store()
    resources.install(found, crds=(), namespaces=("default", "secure", "base"))
    label(found, "secure", {ENFORCE: "restricted"})
    label(found, "base", {ENFORCE: "baseline", f"{ENFORCE}-version": "v1.30"})
    pods.install(found)
    pod_security.install(found)
    yield found


def refusal(store: Store, pod: Obj) -> ApiError:
    with pytest.raises(ApiError) as caught:
        store.create("", "pods", pod["metadata"]["namespace"], pod)
    assert (caught.value.code, caught.value.reason) == (403, "Forbidden")
    return caught.value


def test_a_hardened_pod_passes_restricted(store: Store) -> None:
    created = store.create("", "pods", "secure", copy.deepcopy(HARDENED))
    assert created["metadata"]["name"] == "p"


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        pytest.param(
            with_changes(hostNetwork=True, hostPID=True),
            "host namespaces (hostNetwork=true, hostPID=true)",
            id="host-namespaces",
        ),
        pytest.param(
            with_changes(
                containers=[
                    *HARDENED["spec"]["containers"],
                    # privileged may escalate: the apiserver refuses it kept from escalating
                    container(privileged=True, allowPrivilegeEscalation=True),
                ]
            ),
            'privileged (container "side" must not set securityContext.privileged=true)',
            id="privileged-sidecar",
        ),
        pytest.param(
            with_changes(initContainers=[container(allowPrivilegeEscalation=True)]),
            'allowPrivilegeEscalation != false (container "side" must set '
            "securityContext.allowPrivilegeEscalation=false)",
            id="init-container-escalation",
        ),
        pytest.param(
            with_changes(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
            # restrictedVolumes overrides the baseline's hostPathVolumes: said once
            'violates PodSecurity "restricted:latest": restricted volume types (volume "root" '
            'uses restricted volume type "hostPath")',
            id="host-path",
        ),
        pytest.param(
            with_changes(
                hostNetwork=True,
                containers=[
                    {
                        **HARDENED["spec"]["containers"][0],
                        "ports": [{"containerPort": 8888}, {"containerPort": 9, "hostPort": 99}],
                    }
                ],
            ),
            # a host-network pod's container ports are defaulted to host ports, then judged
            'violates PodSecurity "restricted:latest": host namespaces (hostNetwork=true), '
            'hostPort (container "kernel" uses hostPorts 8888, 99)',
            id="host-network-ports-are-host-ports",
        ),
        pytest.param(
            with_changes(
                securityContext={"runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}
            ),
            'runAsNonRoot != true (pod or container "kernel" must set '
            "securityContext.runAsNonRoot=true), runAsUser=0 (pod must not set runAsUser=0), "
            'seccompProfile (pod must not set securityContext.seccompProfile.type to "Unconfined"; '
            'pod or container "kernel" must set securityContext.seccompProfile.type to '
            '"RuntimeDefault" or "Localhost")',
            id="root-and-unconfined",
        ),
        pytest.param(
            with_changes(containers=[container(capabilities={"add": ["SYS_ADMIN"]})]),
            'violates PodSecurity "restricted:latest": unrestricted capabilities (container '
            '"side" must set securityContext.capabilities.drop=["ALL"]; container "side" must '
            'not include "SYS_ADMIN" in securityContext.capabilities.add)',
            id="added-capability-restricted-overrides-baseline",
        ),
        pytest.param(
            with_changes(containers=[{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]),
            'allowPrivilegeEscalation != false (containers "a", "b" must set '
            "securityContext.allowPrivilegeEscalation=false)",
            id="several-containers-named-together",
        ),
    ],
)
def test_restricted_refuses_with_the_apiservers_sentence(
    store: Store, pod: Obj, message: str
) -> None:
    error = refusal(store, pod)
    assert error.message.startswith(
        'pods "p" is forbidden: violates PodSecurity "restricted:latest": '
    )
    assert message in error.message
    assert store.list_objects("", "pods", "secure")[0] == []


def test_baseline_allows_what_only_restricted_forbids(store: Store) -> None:
    loose = with_changes(containers=[{"name": "a", "image": "x"}], securityContext={})
    loose["metadata"]["namespace"] = "base"
    store.create("", "pods", "base", loose)
    chown = with_changes(containers=[container(capabilities={"add": ["CHOWN", "NET_ADMIN"]})])
    chown["metadata"].update(namespace="base", name="c")
    assert refusal(store, chown).message == (
        'pods "c" is forbidden: violates PodSecurity "baseline:v1.30": non-default capabilities '
        '(container "side" must not include "NET_ADMIN" in securityContext.capabilities.add)'
    )
    bad = with_changes(hostIPC=True)
    bad["metadata"].update(namespace="base", name="q")
    error = refusal(store, bad)
    assert error.message == (
        'pods "q" is forbidden: violates PodSecurity "baseline:v1.30": host namespaces '
        "(hostIPC=true)"
    )


def test_baseline_says_a_host_path_volume_as_such(store: Store) -> None:
    pod = with_changes(volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    pod["metadata"]["namespace"] = "base"
    assert refusal(store, pod).message == (
        'pods "p" is forbidden: violates PodSecurity "baseline:v1.30": hostPath volumes '
        '(volume "root")'
    )


@pytest.mark.parametrize(
    ("security", "cause"),
    [
        ({"privileged": True, "runAsNonRoot": True}, "`privileged` to true"),
        (
            {"capabilities": {"add": ["CAP_SYS_ADMIN"], "drop": ["ALL"]}},
            "`capabilities.Add` CAP_SYS_ADMIN",
        ),
    ],
)
def test_a_container_kept_from_escalating_cannot_be_privileged_in_any_namespace(
    store: Store, security: Obj, cause: str
) -> None:
    """The apiserver's validation, before any admission plugin: 422 in a namespace enforcing
    nothing, and in one enforcing restricted too (the words of kube-apiserver v1.36)."""
    for namespace in ("default", "secure"):
        pod = with_changes(containers=[*HARDENED["spec"]["containers"], container(**security)])
        pod["metadata"]["namespace"] = namespace
        with pytest.raises(ApiError) as caught:
            store.create("", "pods", namespace, pod)
        assert (caught.value.code, caught.value.reason) == (422, "Invalid")
        shown: dict[str, Any] = {
            "Capabilities": {"Add": None, "Drop": ["ALL"]},
            "Privileged": None,
            "SELinuxOptions": None,
            "WindowsOptions": None,
            "RunAsUser": None,
            "RunAsGroup": None,
            "RunAsNonRoot": None,
            "ReadOnlyRootFilesystem": None,
            "AllowPrivilegeEscalation": False,
            "ProcMount": None,
            "SeccompProfile": None,
            "AppArmorProfile": None,
        }
        if "privileged" in security:
            shown |= {"Privileged": True, "RunAsNonRoot": True}
        else:
            shown["Capabilities"]["Add"] = ["CAP_SYS_ADMIN"]
        assert caught.value.message == (
            'Pod "p" is invalid: spec.containers[1].securityContext: Invalid value: '
            f"{json.dumps(shown, separators=(',', ':'))}: cannot set `allowPrivilegeEscalation` "
            f"to false and {cause}"
        )


def test_the_invalid_value_is_the_go_struct_the_real_apiserver_shows() -> None:
    # as kube-apiserver v1.36.3 answered kernel-queue's pod with a privileged sidecar
    context = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "privileged": True,
    }
    assert pods._go_security_context(context) == (
        '{"Capabilities":{"Add":null,"Drop":["ALL"]},"Privileged":true,"SELinuxOptions":null,'
        '"WindowsOptions":null,"RunAsUser":null,"RunAsGroup":null,"RunAsNonRoot":true,'
        '"ReadOnlyRootFilesystem":null,"AllowPrivilegeEscalation":false,"ProcMount":null,'
        '"SeccompProfile":null,"AppArmorProfile":null}'
    )


def test_an_unlabelled_namespace_enforces_nothing(store: Store) -> None:
    pod = with_changes(hostNetwork=True, containers=[{"name": "a", "image": "x"}])
    pod["metadata"]["namespace"] = "default"
    created = store.create("", "pods", "default", pod)
    assert created["spec"]["hostNetwork"] is True  # admitted as asked, nothing enforced


def test_a_pod_whose_service_account_is_missing_is_refused(store: Store) -> None:
    pod = with_changes(serviceAccountName="kernels")
    error = refusal(store, pod)
    assert error.message == (
        'pods "p" is forbidden: error looking up service account secure/kernels: '
        'serviceaccount "kernels" not found'
    )
    store.create("", "serviceaccounts", "secure", {"metadata": {"name": "kernels"}})
    store.create("", "pods", "secure", with_changes(serviceAccountName="kernels"))


def test_the_default_service_account_is_always_there(store: Store) -> None:
    # The ServiceAccount controller makes `default` in every namespace; the fake keeps none.
    created = store.create("", "pods", "secure", with_changes(serviceAccountName="default"))
    assert created["spec"]["serviceAccountName"] == "default"


async def test_the_refusal_reaches_clients_as_a_403_status(
    jp_asyncio_loop: asyncio.AbstractEventLoop, tmp_path: Any
) -> None:
    async with FakeCluster(root_dir=tmp_path, crds=False, kueue=False, kubelet=False) as cluster:
        label(cluster.store, "default", {ENFORCE: "restricted"})
        pod = with_changes(hostPID=True)
        pod["metadata"]["namespace"] = "default"
        request = urllib.request.Request(
            f"{cluster.url}/api/v1/namespaces/default/pods",
            data=json.dumps(pod).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )

        def post() -> tuple[int, Obj]:
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        status, body = await asyncio.to_thread(post)
    assert status == 403
    assert body["kind"] == "Status" and body["reason"] == "Forbidden" and body["code"] == 403
    assert body["message"] == (
        'pods "p" is forbidden: violates PodSecurity "restricted:latest": host namespaces '
        "(hostPID=true)"
    )
