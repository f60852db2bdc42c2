"""The pod_template policy: what a kernelspec's template may not put into a kernel's pods.

Host namespaces, hostPath and other volumes Pod Security "restricted" forbids, privileged or
escalating containers, added capabilities, root, and whatever else contradicts the hardening
`manifests` applies, in the pod and in every container (init, ephemeral and sidecars too).
Pure: a template in, `Violation`s naming field paths out; `spec.build` calls it before anything
is created and turns them into the kernel's error. Server admins may allow listed rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROOT = "pod_template"
SETTING = "c.PodTemplatePolicy.allowed_exceptions"
UNALLOWABLE = frozenset({"shape", "text"})
"""Rules no exception lifts: a template of the wrong shape or with broken text."""
RULES = frozenset(
    {
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "hostPath",
        "volumeTypes",
        "privileged",
        "allowPrivilegeEscalation",
        "capabilities",
        "runAsNonRoot",
        "runAsUser",
        "seccompProfile",
        "hostPort",
        "procMount",
        "sysctls",
        "hostProcess",
        "appArmorProfile",
        "seLinuxOptions",
    }
)
"""Rules a server admin may allow (`SETTING`)."""
RESTRICTED_VOLUMES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
_HOST_NAMESPACES = {
    "hostNetwork": "puts the kernel on the node's network",
    "hostPID": "lets the kernel see and signal the node's processes",
    "hostIPC": "shares the node's IPC namespace with the kernel",
}
_KEYED = frozenset({"labels", "annotations", "nodeSelector"})  # keys shown as [key]


@dataclass(frozen=True)
class Violation:
    """`path` (from `pod_template`) breaks `rule`; `problem` completes "`path` …"."""

    rule: str
    path: str
    problem: str


def violations(template: Any) -> list[Violation]:
    """Every violation of the policy in `template`, in field order; [] for a good one."""
    found: list[Violation] = []
    _texts(template, ROOT, found, keyed=False)
    root = _mapping(template, ROOT, found, "a mapping with metadata and spec")
    if root is None:
        return found
    metadata = _mapping(root.get("metadata", {}), f"{ROOT}.metadata", found)
    if metadata is not None:
        _annotations(metadata, found)
    spec = _mapping(root.get("spec", {}), f"{ROOT}.spec", found, "a mapping of pod fields")
    if spec is not None:
        _pod(spec, f"{ROOT}.spec", found)
    return found


def refused(template: Any, allowed: Iterable[str] = ()) -> list[Violation]:
    """The violations of `template` that no entry of `allowed` (a rule, or a field path where
    ``[*]`` is any index, with or without the leading ``pod_template.``) lifts."""
    entries = list(allowed)
    return [v for v in violations(template) if not _lifted(v, entries)]


def unknown_exceptions(entries: Iterable[str]) -> list[str]:
    """Entries of `SETTING` that are neither an allowable rule nor a field path."""
    return [entry for entry in entries if entry not in RULES and _pattern(entry) is None]


def message(found: Sequence[Violation]) -> str:
    """The sentences a user reads: each field and what is wrong with it, then the fix."""
    listed = "; ".join(f"`{v.path}` {v.problem}" for v in found)
    rules = list(dict.fromkeys(v.rule for v in found if v.rule not in UNALLOWABLE))
    if not rules:
        return f"{listed}. Fix the kernelspec's pod_template"
    them = "it" if len(found) == 1 else "them"
    return (
        f"{listed}. Remove {them} from the kernelspec's pod_template; only a server admin can "
        f"allow {them}, with {SETTING} = {rules!r} in the server's config"
    )


# -- matching exceptions ---------------------------------------------------------------------


def _pattern(entry: str) -> re.Pattern[str] | None:
    path = entry.removeprefix(f"{ROOT}.")
    if not re.match(r"(spec|metadata)([.\[]|$)", path):
        return None
    body = re.escape(path).replace(r"\[\*\]", r"\[[0-9]+\]")
    return re.compile(rf"{body}(?=$|[.\[])")


def _lifted(violation: Violation, entries: Sequence[str]) -> bool:
    if violation.rule in UNALLOWABLE:
        return False
    path = violation.path.removeprefix(f"{ROOT}.")
    for entry in entries:
        pattern = _pattern(entry)
        if entry == violation.rule or (pattern is not None and pattern.match(path)):
            return True
    return False


# -- walking the template --------------------------------------------------------------------


def _shown(value: Any) -> str:
    """A value as kernel.json spells it; escaped where it holds text UTF-8 cannot encode."""
    try:
        text = json.dumps(value, ensure_ascii=False)
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return text


def _mapping(
    value: Any, path: str, found: list[Violation], what: str = "a mapping"
) -> Mapping[str, Any] | None:
    if isinstance(value, Mapping):
        return value
    found.append(Violation("shape", path, f"is {_shown(value)}, which is not {what}"))
    return None


def _items(value: Any, path: str, found: list[Violation]) -> list[tuple[str, Mapping[str, Any]]]:
    """The mappings of list `value` with their paths; shape violations for the rest."""
    if value is None:
        return []
    if not isinstance(value, list):
        found.append(Violation("shape", path, f"is {_shown(value)}, which is not a list"))
        return []
    items = []
    for index, item in enumerate(value):
        mapping = _mapping(item, f"{path}[{index}]", found)
        if mapping is not None:
            items.append((f"{path}[{index}]", mapping))
    return items


def _texts(value: Any, path: str, found: list[Violation], *, keyed: bool) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            problem = f"is {_shown(value)}, which is not valid text (a lone surrogate)"
            found.append(Violation("text", path, problem))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            text = str(key)
            _texts(text, f"{path} (a key)", found, keyed=False)
            child = f"{path}[{text}]" if keyed else f"{path}.{text}"
            _texts(item, child, found, keyed=text in _KEYED)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _texts(item, f"{path}[{index}]", found, keyed=False)


def _annotations(metadata: Mapping[str, Any], found: list[Violation]) -> None:
    annotations = _mapping(metadata.get("annotations", {}), f"{ROOT}.metadata.annotations", found)
    for key, value in (annotations or {}).items():
        if str(key).startswith(APPARMOR_ANNOTATION) and value == "unconfined":
            path = f"{ROOT}.metadata.annotations[{key}]"
            found.append(
                Violation("appArmorProfile", path, f"is {_shown(value)}, which turns AppArmor off")
            )


def _pod(spec: Mapping[str, Any], path: str, found: list[Violation]) -> None:
    for key, why in _HOST_NAMESPACES.items():
        if spec.get(key) is True:
            found.append(Violation(key, f"{path}.{key}", f"is true, which {why}"))
    security = _mapping(spec.get("securityContext", {}), f"{path}.securityContext", found)
    if security is not None:
        _security(security, f"{path}.securityContext", found)
        sysctls = _items(security.get("sysctls"), f"{path}.securityContext.sysctls", found)
        for where, sysctl in sysctls:
            name = sysctl.get("name")
            if name not in SAFE_SYSCTLS:
                problem = f"is {_shown(name)}, which is a sysctl Pod Security does not allow"
                found.append(Violation("sysctls", f"{where}.name", problem))
    for where, volume in _items(spec.get("volumes"), f"{path}.volumes", found):
        _volume(volume, where, found)
    for kind in CONTAINER_LISTS:
        for where, container in _items(spec.get(kind), f"{path}.{kind}", found):
            _container(container, where, found)


def _volume(volume: Mapping[str, Any], path: str, found: list[Violation]) -> None:
    for key, source in volume.items():
        if key == "name" or key in RESTRICTED_VOLUMES:
            continue
        if key == "hostPath":
            problem = f"is {_shown(source)}, which mounts a directory of the node"
            found.append(Violation("hostPath", f"{path}.hostPath", problem))
        else:
            allowed = ", ".join(RESTRICTED_VOLUMES[:-1]) + f" or {RESTRICTED_VOLUMES[-1]}"
            problem = f'is a volume type Pod Security "restricted" forbids (use {allowed})'
            found.append(Violation("volumeTypes", f"{path}.{key}", problem))


def _container(container: Mapping[str, Any], path: str, found: list[Violation]) -> None:
    security = _mapping(container.get("securityContext", {}), f"{path}.securityContext", found)
    if security is not None:
        where = f"{path}.securityContext"
        if security.get("privileged") is True:
            problem = "is true, which gives the container the node's devices and every capability"
            found.append(Violation("privileged", f"{where}.privileged", problem))
        if security.get("allowPrivilegeEscalation") is True:
            problem = "is true, which contradicts the hardening (allowPrivilegeEscalation: false)"
            found.append(
                Violation("allowPrivilegeEscalation", f"{where}.allowPrivilegeEscalation", problem)
            )
        capabilities = _mapping(security.get("capabilities", {}), f"{where}.capabilities", found)
        added = (capabilities or {}).get("add")
        if added:
            problem = (
                f"is {_shown(added)}, which adds Linux capabilities that the hardening drops "
                "(drop: ALL)"
            )
            found.append(Violation("capabilities", f"{where}.capabilities.add", problem))
        mount = security.get("procMount")
        if mount not in (None, "Default"):
            problem = f"is {_shown(mount)}, which unmasks the node's /proc"
            found.append(Violation("procMount", f"{where}.procMount", problem))
        _security(security, where, found)
    for port_path, port in _items(container.get("ports"), f"{path}.ports", found):
        if port.get("hostPort"):
            problem = f"is {_shown(port['hostPort'])}, which binds a port of the node"
            found.append(Violation("hostPort", f"{port_path}.hostPort", problem))


def _security(security: Mapping[str, Any], path: str, found: list[Violation]) -> None:
    """The fields a pod's and a container's securityContext share."""
    if security.get("runAsNonRoot") is False:
        problem = "is false, which contradicts the hardening (runAsNonRoot: true)"
        found.append(Violation("runAsNonRoot", f"{path}.runAsNonRoot", problem))
    user = security.get("runAsUser")
    if isinstance(user, int) and not isinstance(user, bool) and user == 0:
        found.append(
            Violation("runAsUser", f"{path}.runAsUser", "is 0, which runs the kernel as root")
        )
    for key, rule, bad, why in (
        (
            "seccompProfile",
            "seccompProfile",
            lambda kind: kind not in (None, "RuntimeDefault", "Localhost"),
            "turns off the seccomp profile the hardening sets (RuntimeDefault or Localhost)",
        ),
        (
            "appArmorProfile",
            "appArmorProfile",
            lambda kind: kind == "Unconfined",
            "turns AppArmor off",
        ),
    ):
        profile = _mapping(security.get(key, {}), f"{path}.{key}", found)
        kind = (profile or {}).get("type")
        if bad(kind):
            found.append(Violation(rule, f"{path}.{key}.type", f"is {_shown(kind)}, which {why}"))
    windows = _mapping(security.get("windowsOptions", {}), f"{path}.windowsOptions", found)
    if (windows or {}).get("hostProcess") is True:
        problem = "is true, which runs the kernel as a Windows host process"
        found.append(Violation("hostProcess", f"{path}.windowsOptions.hostProcess", problem))
    selinux = _mapping(security.get("seLinuxOptions", {}), f"{path}.seLinuxOptions", found)
    for key in ("user", "role", "type"):
        value = (selinux or {}).get(key)
        if value is None or (key == "type" and value in SELINUX_TYPES):
            continue
        problem = f"is {_shown(value)}, which sets an SELinux {key} Pod Security does not allow"
        found.append(Violation("seLinuxOptions", f"{path}.seLinuxOptions.{key}", problem))
