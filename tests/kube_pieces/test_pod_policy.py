"""The pod_template policy as literal tables: what a kernelspec's template may not set, the
field path each refusal names, and the exceptions only a server admin can allow."""

from __future__ import annotations

from typing import Any

import pytest

from kernel_queue.kube.objects import pod_policy
from kernel_queue.kube.objects.pod_policy import Violation

SIDECAR = {"name": "side", "image": "busybox"}


def template(**spec: Any) -> dict[str, Any]:
    return {"spec": spec}


@pytest.mark.parametrize(
    "allowed",
    [
        pytest.param({}, id="empty"),
        pytest.param(
            {
                "metadata": {"labels": {"team": "ml"}, "annotations": {"a": "b"}},
                "spec": {
                    "nodeSelector": {"gpu": "h200"},
                    "tolerations": [{"key": "gpu", "operator": "Exists"}],
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "fsGroup": 100,
                        "seccompProfile": {"type": "Localhost", "localhostProfile": "k.json"},
                        "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1 2"}],
                    },
                    "containers": [
                        {
                            "name": "kernel",
                            "image": "python:3.11",
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                                "readOnlyRootFilesystem": True,
                                "runAsUser": 1000,
                            },
                            "ports": [{"containerPort": 8080}],
                        },
                        SIDECAR,
                    ],
                    "initContainers": [{"name": "fetch", "image": "busybox"}],
                    "volumes": [
                        {"name": "scratch", "emptyDir": {}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                        {"name": "conf", "configMap": {"name": "c"}},
                    ],
                },
            },
            id="what-admins-set",
        ),
    ],
)
def test_ordinary_templates_pass(allowed: dict[str, Any]) -> None:
    assert pod_policy.violations(allowed) == []


POD_SC = "pod_template.spec.securityContext"
CONTAINER_1 = "pod_template.spec.containers[1].securityContext"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param(
            template(hostNetwork=True, hostPID=True, hostIPC=True),
            [
                Violation(
                    "hostNetwork",
                    "pod_template.spec.hostNetwork",
                    "is true, which puts the kernel on the node's network",
                ),
                Violation(
                    "hostPID",
                    "pod_template.spec.hostPID",
                    "is true, which lets the kernel see and signal the node's processes",
                ),
                Violation(
                    "hostIPC",
                    "pod_template.spec.hostIPC",
                    "is true, which shares the node's IPC namespace with the kernel",
                ),
            ],
            id="host-namespaces",
        ),
        pytest.param(
            template(
                volumes=[
                    {"name": "ok", "emptyDir": {}},
                    {"name": "root", "hostPath": {"path": "/"}},
                ]
            ),
            [
                Violation(
                    "hostPath",
                    "pod_template.spec.volumes[1].hostPath",
                    'is {"path": "/"}, which mounts a directory of the node',
                )
            ],
            id="host-path",
        ),
        pytest.param(
            template(volumes=[{"name": "n", "nfs": {"server": "s", "path": "/"}}]),
            [
                Violation(
                    "volumeTypes",
                    "pod_template.spec.volumes[0].nfs",
                    'is a volume type Pod Security "restricted" forbids (use configMap, csi, '
                    "downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected or "
                    "secret)",
                )
            ],
            id="restricted-volume-type",
        ),
        pytest.param(
            template(
                containers=[
                    {"name": "kernel"},
                    {**SIDECAR, "securityContext": {"privileged": True}},
                ]
            ),
            [
                Violation(
                    "privileged",
                    f"{CONTAINER_1}.privileged",
                    "is true, which gives the container the node's devices and every capability",
                )
            ],
            id="privileged-sidecar",
        ),
        pytest.param(
            template(
                initContainers=[{**SIDECAR, "securityContext": {"allowPrivilegeEscalation": True}}]
            ),
            [
                Violation(
                    "allowPrivilegeEscalation",
                    "pod_template.spec.initContainers[0].securityContext.allowPrivilegeEscalation",
                    "is true, which contradicts the hardening (allowPrivilegeEscalation: false)",
                )
            ],
            id="init-container-escalation",
        ),
        pytest.param(
            template(
                containers=[
                    {"name": "k"},
                    {**SIDECAR, "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
                ]
            ),
            [
                Violation(
                    "capabilities",
                    f"{CONTAINER_1}.capabilities.add",
                    'is ["SYS_ADMIN"], which adds Linux capabilities that the hardening drops '
                    "(drop: ALL)",
                )
            ],
            id="added-capability",
        ),
        pytest.param(
            template(securityContext={"runAsUser": 0, "runAsNonRoot": False}),
            [
                Violation(
                    "runAsNonRoot",
                    f"{POD_SC}.runAsNonRoot",
                    "is false, which contradicts the hardening (runAsNonRoot: true)",
                ),
                Violation(
                    "runAsUser", f"{POD_SC}.runAsUser", "is 0, which runs the kernel as root"
                ),
            ],
            id="root-pod",
        ),
        pytest.param(
            template(ephemeralContainers=[{"name": "dbg", "securityContext": {"runAsUser": 0}}]),
            [
                Violation(
                    "runAsUser",
                    "pod_template.spec.ephemeralContainers[0].securityContext.runAsUser",
                    "is 0, which runs the kernel as root",
                )
            ],
            id="root-ephemeral-container",
        ),
        pytest.param(
            template(securityContext={"seccompProfile": {"type": "Unconfined"}}),
            [
                Violation(
                    "seccompProfile",
                    f"{POD_SC}.seccompProfile.type",
                    'is "Unconfined", which turns off the seccomp profile the hardening sets '
                    "(RuntimeDefault or Localhost)",
                )
            ],
            id="unconfined-seccomp",
        ),
        pytest.param(
            template(containers=[{"name": "k", "ports": [{"containerPort": 80, "hostPort": 80}]}]),
            [
                Violation(
                    "hostPort",
                    "pod_template.spec.containers[0].ports[0].hostPort",
                    "is 80, which binds a port of the node",
                )
            ],
            id="host-port",
        ),
        pytest.param(
            template(containers=[{"name": "k", "securityContext": {"procMount": "Unmasked"}}]),
            [
                Violation(
                    "procMount",
                    "pod_template.spec.containers[0].securityContext.procMount",
                    'is "Unmasked", which unmasks the node\'s /proc',
                )
            ],
            id="proc-mount",
        ),
        pytest.param(
            template(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
            [
                Violation(
                    "sysctls",
                    f"{POD_SC}.sysctls[0].name",
                    'is "kernel.msgmax", which is a sysctl Pod Security does not allow',
                )
            ],
            id="unsafe-sysctl",
        ),
        pytest.param(
            template(securityContext={"windowsOptions": {"hostProcess": True}}),
            [
                Violation(
                    "hostProcess",
                    f"{POD_SC}.windowsOptions.hostProcess",
                    "is true, which runs the kernel as a Windows host process",
                )
            ],
            id="windows-host-process",
        ),
        pytest.param(
            {
                "metadata": {
                    "annotations": {
                        "container.apparmor.security.beta.kubernetes.io/k": "unconfined"
                    }
                }
            },
            [
                Violation(
                    "appArmorProfile",
                    "pod_template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/k]",
                    'is "unconfined", which turns AppArmor off',
                )
            ],
            id="apparmor-annotation",
        ),
        pytest.param(
            template(
                containers=[
                    {"name": "k", "securityContext": {"seLinuxOptions": {"user": "sysadm_u"}}}
                ]
            ),
            [
                Violation(
                    "seLinuxOptions",
                    "pod_template.spec.containers[0].securityContext.seLinuxOptions.user",
                    'is "sysadm_u", which sets an SELinux user Pod Security does not allow',
                )
            ],
            id="selinux-user",
        ),
    ],
)
def test_each_rule_names_the_field(given: dict[str, Any], expected: list[Violation]) -> None:
    assert pod_policy.violations(given) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param(
            {"spec": []},
            [
                Violation(
                    "shape", "pod_template.spec", "is [], which is not a mapping of pod fields"
                )
            ],
            id="spec-not-a-mapping",
        ),
        pytest.param(
            template(containers={"name": "k"}),
            [
                Violation(
                    "shape", "pod_template.spec.containers", 'is {"name": "k"}, which is not a list'
                )
            ],
            id="containers-not-a-list",
        ),
        pytest.param(
            template(containers=["k"]),
            [
                Violation(
                    "shape", "pod_template.spec.containers[0]", 'is "k", which is not a mapping'
                )
            ],
            id="container-not-a-mapping",
        ),
        pytest.param(
            template(containers=[{"name": "k", "securityContext": "privileged"}]),
            [
                Violation(
                    "shape",
                    "pod_template.spec.containers[0].securityContext",
                    'is "privileged", which is not a mapping',
                )
            ],
            id="security-context-not-a-mapping",
        ),
        pytest.param(
            {"metadata": {"labels": {"team": "ml\ud800"}}},
            [
                Violation(
                    "text",
                    "pod_template.metadata.labels[team]",
                    'is "ml\\ud800", which is not valid text (a lone surrogate)',
                )
            ],
            id="lone-surrogate",
        ),
    ],
)
def test_a_template_of_the_wrong_shape_is_refused_naming_the_field(
    given: dict[str, Any], expected: list[Violation]
) -> None:
    assert pod_policy.violations(given) == expected


PRIVILEGED_SIDECAR = template(
    containers=[{"name": "k"}, {**SIDECAR, "securityContext": {"privileged": True}}],
    hostNetwork=True,
)


@pytest.mark.parametrize(
    ("allowed", "left"),
    [
        pytest.param((), ["hostNetwork", "privileged"], id="none"),
        pytest.param(("privileged",), ["hostNetwork"], id="by-rule"),
        pytest.param(
            ("spec.containers[*].securityContext.privileged",), ["hostNetwork"], id="any-index"
        ),
        pytest.param(("pod_template.spec.containers[1]",), ["hostNetwork"], id="a-whole-container"),
        pytest.param(
            ("spec.containers[0].securityContext.privileged",),
            ["hostNetwork", "privileged"],
            id="other-index",
        ),
        pytest.param(("hostNetwork", "privileged"), [], id="both"),
    ],
)
def test_only_listed_exceptions_are_allowed(allowed: tuple[str, ...], left: list[str]) -> None:
    assert [v.rule for v in pod_policy.refused(PRIVILEGED_SIDECAR, allowed)] == left


def test_shape_and_text_cannot_be_allowed() -> None:
    assert pod_policy.refused({"spec": []}, ("shape", "spec")) != []


@pytest.mark.parametrize(
    ("entries", "unknown"),
    [
        pytest.param(
            ["privileged", "spec.volumes[*].hostPath", "pod_template.spec.hostPID"], [], id="valid"
        ),
        pytest.param(
            ["priviledged", "host_path", "shape"], ["priviledged", "host_path", "shape"], id="typos"
        ),
    ],
)
def test_exception_entries_are_rules_or_field_paths(entries: list[str], unknown: list[str]) -> None:
    assert pod_policy.unknown_exceptions(entries) == unknown


def test_the_message_names_each_field_and_the_admin_setting() -> None:
    assert pod_policy.message(pod_policy.refused(PRIVILEGED_SIDECAR, ())) == (
        "`pod_template.spec.hostNetwork` is true, which puts the kernel on the node's network; "
        "`pod_template.spec.containers[1].securityContext.privileged` is true, which gives the "
        "container the node's devices and every capability. Remove them from the kernelspec's "
        "pod_template; only a server admin can allow them, with "
        "c.PodTemplatePolicy.allowed_exceptions = ['hostNetwork', 'privileged'] in the "
        "server's config"
    )
    assert pod_policy.message(pod_policy.refused({"spec": []}, ())) == (
        "`pod_template.spec` is [], which is not a mapping of pod fields. Fix the kernelspec's "
        "pod_template"
    )
