"""The apiserver's own pod rules, with or without a node: admission of pods and their conditions.

`install` adds the apiserver's pod admission (defaults, a host-network pod's hostPorts among
them, Pending status, SchedulingGated, the gate-removal rule, spec immutability, no container
both privileged and kept from escalating) and graceful deletion (`grace_period`: a pod bound to
a node and not finished only gets `deletionTimestamp` until its kubelet deletes it with grace 0);
`bind` is the `pods/{name}/binding` subresource a scheduler (or the node agent of a plane without
one) binds a pod to a node with. What a spec means to the kubelet (env, volumes) is the node
agent's (`node/pod_env.py`, `node/volumes.py`).
"""

from __future__ import annotations

import copy
import json
import re
import weakref
from typing import Any

from kernel_queue_fake_cluster.apiserver.errors import ApiError, invalid
from kernel_queue_fake_cluster.apiserver.kinds import Obj, now_rfc3339
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.common.pods import condition, gates, scheduling_gated, terminal

FAKE_MOUNT_PREFIX = "KUBE_FAKE_MOUNT_"
_INSTALLED: weakref.WeakSet[Store] = weakref.WeakSet()
_IMMUTABLE = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
    "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set "
    "to 1 if it was previously negative)"
)


def install(store: Store) -> None:
    """Add the pod admission rules to `store` (once per store; later calls do nothing).

    Install it after webhooks that add scheduling gates on CREATE (the fake Kueue), so the
    SchedulingGated condition sees them; the node agent also sets it after the commit when it
    plays the scheduler.
    """
    if store in _INSTALLED:
        return
    _INSTALLED.add(store)

    def admit(operation: str, new: Obj | None, old: Obj | None) -> Obj | None:
        if new is None:
            return None
        causes = _create_causes(new) if old is None else _update_causes(new, old)
        if causes:
            raise invalid(store.type("", "pods"), new["metadata"].get("name", ""), causes)
        return _defaulted(new) if old is None else None

    store.add_admission("", "pods", admit)
    store.add_graceful("", "pods", grace_period)


def grace_period(pod: Obj, requested: int | None) -> int:
    """The grace period a DELETE gives a pod, as the apiserver's pod strategy decides: the
    request's, else `terminationGracePeriodSeconds`; 0 for a pod no node took and for one
    that finished (Succeeded, Failed): those go at once."""
    spec = pod.get("spec") or {}
    period = int(spec.get("terminationGracePeriodSeconds", 30) if requested is None else requested)
    if not spec.get("nodeName") or terminal(pod):
        return 0
    return max(period, 1) if period < 0 else period


def bind(store: Store, namespace: str, name: str, binding: Obj) -> Obj:
    """POST `pods/{name}/binding`: set `spec.nodeName` to the binding's target and PodScheduled
    True, in one write; 409 Conflict when the pod is already bound, being deleted, still gated
    or another pod than the binding's uid names. The answer is a Success `Status`."""
    rtype = store.type("", "pods")
    node = (binding.get("target") or {}).get("name")
    if not node:
        raise invalid(rtype, name, [("target.name", "Required value")])
    pod = store.get("", "pods", namespace, name)
    meta, spec = pod["metadata"], pod["spec"]
    uid = (binding.get("metadata") or {}).get("uid")
    why = ""
    if uid and uid != meta["uid"]:
        why = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta['uid']}"
    elif meta.get("deletionTimestamp"):
        why = f"pod {name} is being deleted, cannot be assigned to a host"
    elif spec.get("nodeName"):
        why = f'pod {name} is already assigned to node "{spec["nodeName"]}"'
    elif gates(pod):
        why = f"pod {name} has non-empty .spec.schedulingGates"
    if why:
        message = f'Operation cannot be fulfilled on pods/binding "{name}": {why}'
        raise ApiError(409, "Conflict", message, {"name": name, "kind": "pods/binding"})
    spec["nodeName"] = node
    status = pod.setdefault("status", {})
    conditions = status.get("conditions") or []
    previous = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
    scheduled = condition("PodScheduled", True, now_rfc3339())
    if previous is not None and previous.get("status") == "True":
        scheduled["lastTransitionTime"] = previous.get("lastTransitionTime")
    status["conditions"] = [
        scheduled if c.get("type") == "PodScheduled" else c for c in conditions
    ] + ([] if previous is not None else [scheduled])
    store.replace("", "pods", namespace, name, pod, subresource="binding")
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def evict(store: Store, namespace: str, name: str, eviction: Obj) -> Obj:
    """POST `pods/{name}/eviction` (policy/v1 Eviction): a graceful delete of the pod, with the
    eviction's `deleteOptions` (its own grace period unless they give one). No
    PodDisruptionBudget is served here, so every eviction is allowed, as on a cluster without
    one. The answer is a Success `Status`, 201, as the real API server's."""
    options = eviction.get("deleteOptions") or {}
    grace = options.get("gracePeriodSeconds")
    uid = (options.get("preconditions") or {}).get("uid")
    store.delete("", "pods", namespace, name, grace_seconds=grace, uid=uid)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _create_causes(pod: Obj) -> list[tuple[str, str]]:
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        return [("spec.containers", "Required value")]
    causes, seen = [], set()
    for i, container in enumerate(containers):
        name = container.get("name") or ""
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
            causes.append((f"spec.containers[{i}].name", f'Invalid value: "{name}"'))
        elif name in seen:
            causes.append((f"spec.containers[{i}].name", f'Duplicate value: "{name}"'))
        seen.add(name)
        if not container.get("image"):
            causes.append((f"spec.containers[{i}].image", "Required value"))
    for kind in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(kind) or []):
            path = f"spec.{kind}[{i}].securityContext"
            causes += [(path, m) for m in _security_causes(container.get("securityContext"))]
    return causes


def _security_causes(context: Any) -> list[str]:
    """The apiserver's checks of a container's securityContext that need no other field
    (ValidateSecurityContext): no escalation forbidden while privileged or adding
    CAP_SYS_ADMIN, both of which escalate."""
    if not isinstance(context, dict) or context.get("allowPrivilegeEscalation") is not False:
        return []
    value = _go_security_context(context)
    causes = []
    if context.get("privileged") is True:
        causes.append("cannot set `allowPrivilegeEscalation` to false and `privileged` to true")
    added = (context.get("capabilities") or {}).get("add") or []
    causes += [
        "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN"
        for capability in added
        if capability == "CAP_SYS_ADMIN"
    ]
    return [f"Invalid value: {value}: {cause}" for cause in causes]


_GO_SECURITY_FIELDS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("capabilities", "Capabilities", {"add": "Add", "drop": "Drop"}),
    ("privileged", "Privileged", {}),
    (
        "seLinuxOptions",
        "SELinuxOptions",
        {"user": "User", "role": "Role", "type": "Type", "level": "Level"},
    ),
    (
        "windowsOptions",
        "WindowsOptions",
        {
            "gmsaCredentialSpecName": "GMSACredentialSpecName",
            "gmsaCredentialSpec": "GMSACredentialSpec",
            "runAsUserName": "RunAsUserName",
            "hostProcess": "HostProcess",
        },
    ),
    ("runAsUser", "RunAsUser", {}),
    ("runAsGroup", "RunAsGroup", {}),
    ("runAsNonRoot", "RunAsNonRoot", {}),
    ("readOnlyRootFilesystem", "ReadOnlyRootFilesystem", {}),
    ("allowPrivilegeEscalation", "AllowPrivilegeEscalation", {}),
    ("procMount", "ProcMount", {}),
    ("seccompProfile", "SeccompProfile", {"type": "Type", "localhostProfile": "LocalhostProfile"}),
    (
        "appArmorProfile",
        "AppArmorProfile",
        {"type": "Type", "localhostProfile": "LocalhostProfile"},
    ),
)
"""The Go struct of a container's securityContext: each field's JSON and Go names, in order,
and those of its parts."""


def _go_security_context(context: Obj) -> str:
    """`context` as the apiserver shows an invalid securityContext: its Go struct in JSON, the
    fields by their Go names in the struct's order, null where unset ("" for SELinuxOptions'
    plain strings)."""
    shown: dict[str, Any] = {}
    for key, name, parts in _GO_SECURITY_FIELDS:
        value = context.get(key)
        if parts and isinstance(value, dict):
            unset = "" if key == "seLinuxOptions" else None
            value = {go: value.get(part, unset) for part, go in parts.items()}
        shown[name] = value
    return json.dumps(shown, separators=(",", ":"))


def _defaulted(pod: Obj) -> Obj:
    spec = pod["spec"]
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("schedulerName", "default-scheduler")
    for container in [*spec["containers"], *spec.get("initContainers", [])]:
        for kind in ("requests", "limits"):
            amounts = (container.get("resources") or {}).get(kind) or {}
            for name, amount in amounts.items():
                amounts[name] = _quantity_text(amount)
    for container in spec["containers"]:
        latest = ":" not in container["image"].rsplit("/", 1)[-1] or container["image"].endswith(
            ":latest"
        )
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    if spec.get("hostNetwork"):  # on the node's network a container port is the node's port
        for container in [*spec["containers"], *spec.get("initContainers", [])]:
            for port in container.get("ports") or []:
                if not port.get("hostPort") and port.get("containerPort"):
                    port["hostPort"] = port["containerPort"]
    status: Obj = {"phase": "Pending", "qosClass": _qos_class(spec["containers"])}
    if gates(pod):
        status["conditions"] = [scheduling_gated(now_rfc3339())]
    pod["status"] = status  # the apiserver ignores a status sent with a create
    return pod


def _quantity_text(amount: Any) -> str:
    """Quantities are strings on the wire: the apiserver makes `cpu: 3` "3" and 0.5 "500m"."""
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        return str(amount)
    if float(amount).is_integer():
        return str(int(amount))
    return f"{round(amount * 1000)}m"


def _qos_class(containers: list[Obj]) -> str:
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    for r in resources:
        limits, requests = r.get("limits") or {}, r.get("requests") or {}
        if not all(k in limits for k in ("cpu", "memory")):
            return "Burstable"
        if any(str(requests.get(k, limits[k])) != str(limits[k]) for k in limits):
            return "Burstable"
    return "Guaranteed"


def _update_causes(new: Obj, old: Obj) -> list[tuple[str, str]]:
    """The real rules that are cheap to check; affinity changes while gated are not checked."""
    spec, old_spec = copy.deepcopy(new.get("spec") or {}), copy.deepcopy(old.get("spec") or {})
    if spec == old_spec:
        return []
    old_gates = gates(old)
    for name in gates(new):
        if name not in old_gates:
            message = f"Forbidden: only deletion is allowed, but found new scheduling gate '{name}'"
            return [("spec.schedulingGates", message)]
    causes = []
    old_tolerations = old_spec.get("tolerations") or []
    if any(t not in (spec.get("tolerations") or []) for t in old_tolerations):
        causes.append(("spec.tolerations", "Forbidden: existing toleration can not be modified"))
    if old_gates:
        selector, old_selector = spec.get("nodeSelector") or {}, old_spec.get("nodeSelector") or {}
        if any(selector.get(k) != v for k, v in old_selector.items()):
            message = "Invalid value: only additions to spec.nodeSelector are allowed"
            causes.append(("spec.nodeSelector", message))
        for s in (spec, old_spec):
            s.pop("nodeSelector", None)
            s.pop("affinity", None)
    if not old_spec.get("nodeName"):
        spec.pop("nodeName", None)  # binding: the scheduler sets it once
    for s in (spec, old_spec):
        for field in ("activeDeadlineSeconds", "tolerations", "schedulingGates"):
            s.pop(field, None)
        for kind in ("containers", "initContainers"):
            for container in s.get(kind) or []:
                container.pop("image", None)
    if spec != old_spec:
        causes.append(("spec", f"Forbidden: {_IMMUTABLE}"))
    return causes
