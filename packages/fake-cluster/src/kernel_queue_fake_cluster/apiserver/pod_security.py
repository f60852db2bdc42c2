"""The fake apiserver's pod admission plugins: ServiceAccount lookup and Pod Security admission.

A pod whose ServiceAccount does not exist, or that breaks the Pod Security level its namespace
enforces (label `pod-security.kubernetes.io/enforce`: `baseline` or `restricted`), is refused
with 403 Forbidden and the apiserver's wording, before it is stored. Written from the Pod
Security Standards, independently of `kernel_queue.kube.objects.pod_policy`, so each checks the
other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.apiserver.store import Store

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
BASELINE_CAPABILITIES = frozenset(
    [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ]
)
RESTRICTED_VOLUMES = frozenset(
    [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ]
)
SAFE_SYSCTLS = frozenset(
    [
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
    ]
)
# The ServiceAccount controller makes `default` in every namespace; the fake keeps none and
# takes it as present.
DEFAULT_SERVICE_ACCOUNT = "default"

Check = Callable[[Obj], str | None]  # pod spec -> the forbidden detail, or None


def install(store: Store) -> None:
    """Add the ServiceAccount and Pod Security admission of pods to `store`; after the
    mutating hooks (the fake Kueue's webhook, `pod_rules.install`), as a real apiserver orders
    them."""

    def admit(operation: str, new: Obj | None, old: Obj | None) -> Obj | None:
        if operation == "CREATE" and new is not None:
            _check_service_account(store, new)
            _check_pod_security(store, new)
        return None

    store.add_admission("", "pods", admit)


def _forbidden(pod: Obj, reason: str) -> ApiError:
    name = pod["metadata"].get("name", "")
    details = {"name": name, "kind": "pods"}
    return ApiError(403, "Forbidden", f'pods "{name}" is forbidden: {reason}', details)


def _check_service_account(store: Store, pod: Obj) -> None:
    spec = pod.get("spec") or {}
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or ""
    if account in ("", DEFAULT_SERVICE_ACCOUNT):
        return
    namespace = pod["metadata"].get("namespace", "")
    try:
        store.get("", "serviceaccounts", namespace, account)
    except ApiError as exc:
        if exc.code != 404:
            raise
        raise _forbidden(
            pod,
            f"error looking up service account {namespace}/{account}: "
            f'serviceaccount "{account}" not found',
        ) from None


def _check_pod_security(store: Store, pod: Obj) -> None:
    namespace = store.get("", "namespaces", None, pod["metadata"].get("namespace", ""))
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE_LABEL, "privileged")
    if level not in ("baseline", "restricted"):
        return
    version = labels.get(VERSION_LABEL, "latest")
    checks = dict(_BASELINE)
    if level == "restricted":
        checks.update(_RESTRICTED)
        for overridden in _OVERRIDDEN:
            checks.pop(overridden)
    spec = pod.get("spec") or {}
    found = []
    for check_id in sorted(checks):  # the apiserver reports its checks in ID order
        reason, check = checks[check_id]
        detail = check(spec)
        if detail is not None:
            found.append(f"{reason} ({detail})")
    if found:
        raise _forbidden(pod, f'violates PodSecurity "{level}:{version}": {", ".join(found)}')


# -- helpers ----------------------------------------------------------------------------------


def _containers(spec: Obj) -> Iterator[Obj]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _security(item: Obj) -> Obj:
    return item.get("securityContext") or {}


def _quote(items: list[str]) -> str:
    return ", ".join(f'"{item}"' for item in items)


def _containers_named(names: list[str]) -> str:
    return f"{'container' if len(names) == 1 else 'containers'} {_quote(names)}"


def _setters(pod_bad: bool, containers: list[str]) -> str:
    parts = ["pod"] if pod_bad else []
    if containers:
        parts.append(_containers_named(containers))
    return " and ".join(parts)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


# -- baseline ----------------------------------------------------------------------------------


def _host_namespaces(spec: Obj) -> str | None:
    found = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    return ", ".join(found) or None


def _privileged(spec: Obj) -> str | None:
    bad = [c["name"] for c in _containers(spec) if _security(c).get("privileged")]
    return f"{_containers_named(bad)} must not set securityContext.privileged=true" if bad else None


def _capabilities_baseline(spec: Obj) -> str | None:
    bad, caps = [], []
    for c in _containers(spec):
        added = [a for a in (_security(c).get("capabilities") or {}).get("add") or []]
        forbidden = [a for a in added if a not in BASELINE_CAPABILITIES]
        if forbidden:
            bad.append(c["name"])
            caps += forbidden
    if not bad:
        return None
    return (
        f"{_containers_named(bad)} must not include {_quote(_unique(caps))} in "
        "securityContext.capabilities.add"
    )


def _host_path_volumes(spec: Obj) -> str | None:
    bad = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    return f"{'volume' if len(bad) == 1 else 'volumes'} {_quote(bad)}" if bad else None


def _host_ports(spec: Obj) -> str | None:
    bad, ports = [], []
    for c in _containers(spec):
        used = [str(p["hostPort"]) for p in c.get("ports") or [] if p.get("hostPort")]
        if used:
            bad.append(c["name"])
            ports += used
    if not bad:
        return None
    verb = "uses" if len(bad) == 1 else "use"
    noun = "hostPort" if len(ports) == 1 else "hostPorts"
    return f"{_containers_named(bad)} {verb} {noun} {', '.join(ports)}"


def _proc_mount(spec: Obj) -> str | None:
    bad, values = [], []
    for c in _containers(spec):
        mount = _security(c).get("procMount")
        if mount not in (None, "Default"):
            bad.append(c["name"])
            values.append(str(mount))
    if not bad:
        return None
    return f"{_containers_named(bad)} must not set securityContext.procMount to {_quote(values)}"


def _seccomp_baseline(spec: Obj) -> str | None:
    pod_bad = ((_security(spec).get("seccompProfile") or {}).get("type")) == "Unconfined"
    bad = [
        c["name"]
        for c in _containers(spec)
        if (_security(c).get("seccompProfile") or {}).get("type") == "Unconfined"
    ]
    if not pod_bad and not bad:
        return None
    return (
        f'{_setters(pod_bad, bad)} must not set securityContext.seccompProfile.type to "Unconfined"'
    )


def _sysctls(spec: Obj) -> str | None:
    names = [s.get("name", "") for s in _security(spec).get("sysctls") or []]
    bad = [name for name in names if name not in SAFE_SYSCTLS]
    return ", ".join(bad) or None


# -- restricted --------------------------------------------------------------------------------


def _allow_privilege_escalation(spec: Obj) -> str | None:
    bad = [
        c["name"]
        for c in _containers(spec)
        if _security(c).get("allowPrivilegeEscalation") is not False
    ]
    if not bad:
        return None
    return f"{_containers_named(bad)} must set securityContext.allowPrivilegeEscalation=false"


def _capabilities_restricted(spec: Obj) -> str | None:
    missing, adding, caps = [], [], []
    for c in _containers(spec):
        capabilities = _security(c).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            missing.append(c["name"])
        forbidden = [a for a in capabilities.get("add") or [] if a != "NET_BIND_SERVICE"]
        if forbidden:
            adding.append(c["name"])
            caps += forbidden
    details = []
    if missing:
        details.append(
            f'{_containers_named(missing)} must set securityContext.capabilities.drop=["ALL"]'
        )
    if adding:
        details.append(
            f"{_containers_named(adding)} must not include {_quote(_unique(caps))} in "
            "securityContext.capabilities.add"
        )
    return "; ".join(details) or None


def _restricted_volumes(spec: Obj) -> str | None:
    bad, kinds = [], []
    for volume in spec.get("volumes") or []:
        used = [key for key in volume if key != "name" and key not in RESTRICTED_VOLUMES]
        if used:
            bad.append(volume.get("name", ""))
            kinds += used
    if not bad:
        return None
    kinds = _unique(kinds)
    return (
        f"{'volume' if len(bad) == 1 else 'volumes'} {_quote(bad)} "
        f"{'uses' if len(bad) == 1 else 'use'} "
        f"{'restricted volume type' if len(kinds) == 1 else 'restricted volume types'} "
        f"{_quote(kinds)}"
    )


def _pod_or_containers(
    spec: Obj, read: Callable[[Obj], Any], good: Callable[[Any], bool], want: str, refuse: str
) -> str | None:
    """The runAsNonRoot / seccomp shape: set badly at pod or container level, or left unset
    in a container while the pod does not set it well."""
    pod_value = read(_security(spec))
    pod_bad, pod_good = pod_value is not None and not good(pod_value), good(pod_value)
    explicit, implicit, values = [], [], []
    for c in _containers(spec):
        value = read(_security(c))
        if value is not None and not good(value):
            explicit.append(c["name"])
            values.append(str(value))
        elif value is None and not pod_good:
            implicit.append(c["name"])
    if pod_bad:
        values.insert(0, str(pod_value))
    details = []
    if pod_bad or explicit:
        details.append(
            f"{_setters(pod_bad, explicit)} must not set {refuse.format(_quote(_unique(values)))}"
        )
    if implicit:
        details.append(f"pod or {_containers_named(implicit)} must set {want}")
    return "; ".join(details) or None


def _run_as_non_root(spec: Obj) -> str | None:
    return _pod_or_containers(
        spec,
        lambda sc: sc.get("runAsNonRoot"),
        lambda value: value is True,
        "securityContext.runAsNonRoot=true",
        "securityContext.runAsNonRoot=false",
    )


def _seccomp_restricted(spec: Obj) -> str | None:
    return _pod_or_containers(
        spec,
        lambda sc: (sc.get("seccompProfile") or {}).get("type"),
        lambda value: value in ("RuntimeDefault", "Localhost"),
        'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"',
        "securityContext.seccompProfile.type to {}",
    )


def _run_as_user(spec: Obj) -> str | None:
    pod_bad = _security(spec).get("runAsUser") == 0
    bad = [c["name"] for c in _containers(spec) if _security(c).get("runAsUser") == 0]
    if not pod_bad and not bad:
        return None
    return f"{_setters(pod_bad, bad)} must not set runAsUser=0"


_BASELINE: dict[str, tuple[str, Check]] = {
    "capabilities_baseline": ("non-default capabilities", _capabilities_baseline),
    "hostNamespaces": ("host namespaces", _host_namespaces),
    "hostPathVolumes": ("hostPath volumes", _host_path_volumes),
    "hostPorts": ("hostPort", _host_ports),
    "privileged": ("privileged", _privileged),
    "procMount": ("procMount", _proc_mount),
    "seccompProfile_baseline": ("seccompProfile", _seccomp_baseline),
    "sysctls": ("forbidden sysctls", _sysctls),
}
_RESTRICTED: dict[str, tuple[str, Check]] = {
    "allowPrivilegeEscalation": ("allowPrivilegeEscalation != false", _allow_privilege_escalation),
    "capabilities_restricted": ("unrestricted capabilities", _capabilities_restricted),
    "restrictedVolumes": ("restricted volume types", _restricted_volumes),
    "runAsNonRoot": ("runAsNonRoot != true", _run_as_non_root),
    "runAsUser": ("runAsUser=0", _run_as_user),
    "seccompProfile_restricted": ("seccompProfile", _seccomp_restricted),
}
_OVERRIDDEN = ("capabilities_baseline", "hostPathVolumes", "seccompProfile_baseline")
"""Baseline checks a restricted one replaces (the apiserver's OverrideCheckIDs): a hostPath
volume is reported once, as a restricted volume type."""
