"""What a pod spec means to the fake cluster: the apiserver's pod rules and the kubelet's reading.

`install` adds the apiserver's pod admission (defaults, Pending status, SchedulingGated, the
gate-removal rule, spec immutability). The rest translates a spec for the fake kubelet: env
(literals, Secrets, ConfigMaps, downward API, `$(VAR)`), volumes as local directories, and
`Mounts`, which maps each `mountPath` to its directory. No processes and no status writes here.
"""

from __future__ import annotations

import base64
import copy
import math
import os
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_queue import quantities

from kernel_queue_fake_cluster.apiserver.errors import ApiError, invalid
from kernel_queue_fake_cluster.apiserver.kinds import Obj, now_rfc3339
from kernel_queue_fake_cluster.apiserver.store import Store

FAKE_MOUNT_PREFIX = "KUBE_FAKE_MOUNT_"
_INSTALLED: weakref.WeakSet[Store] = weakref.WeakSet()
_IMMUTABLE = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
    "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set "
    "to 1 if it was previously negative)"
)


class ConfigError(Exception):
    """A container cannot start yet (its waiting reason and message, as the kubelet reports)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


# -- admission -------------------------------------------------------------------------------


def install(store: Store) -> None:
    """Add the pod admission rules to `store` (once per store; later calls do nothing).

    Install it after webhooks that add scheduling gates on CREATE (the fake Kueue), so the
    SchedulingGated condition sees them; the fake kubelet also sets it after the commit.
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


def gates(pod: Obj) -> list[str]:
    """Names of the pod's scheduling gates."""
    return [g.get("name", "") for g in (pod.get("spec") or {}).get("schedulingGates") or []]


def scheduling_gated(now: str) -> Obj:
    """The PodScheduled condition of a gated pod, as kube-scheduler writes it."""
    return condition(
        "PodScheduled",
        False,
        now,
        "SchedulingGated",
        "Scheduling is blocked due to non-empty scheduling gates",
    )


def condition(kind: str, status: bool, now: str, reason: str = "", message: str = "") -> Obj:
    """One pod condition dict (`lastProbeTime` null, as the kubelet leaves it)."""
    found: Obj = {"type": kind, "status": "True" if status else "False", "lastProbeTime": None}
    found["lastTransitionTime"] = now
    if reason:
        found["reason"] = reason
    if message:
        found["message"] = message
    return found


def _create_causes(pod: Obj) -> list[tuple[str, str]]:
    containers = (pod.get("spec") or {}).get("containers") or []
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
    return causes


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


# -- env ---------------------------------------------------------------------------------------


def container_env(
    store: Store, pod: Obj, container: Obj, mounts: Mounts, base: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """`(env for the process, env as the spec means it)`: `base` + mount variables, then
    `envFrom`, then `env` in order. `$(VAR)` expands against earlier spec values; literal values
    (after expansion) are rewritten through `mounts`. ConfigError when a source is missing."""
    env = {**base, **mounts.env()}
    raw: dict[str, str] = {}
    namespace = pod["metadata"]["namespace"]
    for source in container.get("envFrom") or []:
        for kind in ("configMapRef", "secretRef"):
            if kind in source:
                ref = source[kind]
                data = _lookup(store, kind, namespace, ref.get("name", ""), ref.get("optional"))
                for key, value in (data or {}).items():
                    name = source.get("prefix", "") + key
                    env[name] = raw[name] = value
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" in item:
            found = _value_from(store, pod, container, item["valueFrom"])
            if found is None:
                continue
            env[name] = raw[name] = found
        else:
            raw[name] = expand(str(item.get("value", "")), raw)
            env[name] = mounts.rewrite(raw[name])
    return env, raw


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names are replaced, `$$` is a literal `$`."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][-._A-Za-z0-9]*)\)", one, text)


def _lookup(store: Store, kind: str, namespace: str, name: str, optional: Any) -> dict[str, str]:
    """Decoded data of a Secret (`secretRef`/`secretKeyRef`/`secret`) or ConfigMap, or {}."""
    secret = kind.startswith("secret")
    plural = "secrets" if secret else "configmaps"
    try:
        obj = store.get("", plural, namespace, name)
    except ApiError:
        if optional:
            return {}
        raise ConfigError(
            "CreateContainerConfigError",
            f'{"secret" if secret else "configmap"} "{name}" not found',
        ) from None
    data = {k: _decode(v) for k, v in (obj.get("data") or {}).items()} if secret else {}
    if not secret:
        data = {k: _decode(v) for k, v in (obj.get("binaryData") or {}).items()}
        data.update({k: str(v) for k, v in (obj.get("data") or {}).items()})
    data.update({k: str(v) for k, v in (obj.get("stringData") or {}).items()})
    return data


def _decode(value: Any) -> str:
    return base64.b64decode(str(value)).decode("utf-8", errors="replace")


def _value_from(store: Store, pod: Obj, container: Obj, source: Obj) -> str | None:
    namespace = pod["metadata"]["namespace"]
    for kind, label in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
        if kind in source:
            ref = source[kind]
            data = _lookup(store, kind, namespace, ref.get("name", ""), ref.get("optional"))
            if ref.get("key") in data:
                return data[ref["key"]]
            if ref.get("optional"):
                return None
            message = f"couldn't find key {ref.get('key')} in {label} {namespace}/{ref.get('name')}"
            raise ConfigError("CreateContainerConfigError", message)
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"].get("fieldPath", ""))
    if "resourceFieldRef" in source:
        ref = source["resourceFieldRef"]
        section, _, resource = ref.get("resource", "").partition(".")
        value = ((container.get("resources") or {}).get(section) or {}).get(resource)
        if value is None:  # unset: the node's allocatable; this node has the host's CPUs
            return str(os.cpu_count() or 1) if resource == "cpu" else "0"
        divided = quantities.parse(value) / quantities.parse(ref.get("divisor") or "1")
        return str(math.ceil(divided))
    raise ConfigError("CreateContainerConfigError", f"unsupported valueFrom {sorted(source)}")


def field_value(pod: Obj, path: str) -> str:
    """A downward API `fieldPath` (metadata.*, labels/annotations['k'], spec.*, status IPs)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    found = re.fullmatch(r"metadata\.(labels|annotations)\['([^']*)'\]", path)
    if found:
        return str((meta.get(found.group(1)) or {}).get(found.group(2), ""))
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or []),
    }
    if path in ("metadata.labels", "metadata.annotations"):
        items = (meta.get(path.split(".")[1]) or {}).items()
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items))
    if path not in simple:
        raise ConfigError("CreateContainerConfigError", f"unsupported fieldPath {path!r}")
    return str(simple[path] or "")


# -- volumes and mounts ------------------------------------------------------------------------


def missing_claims(store: Store, pod: Obj) -> list[str]:
    """Claims the pod needs that do not exist (not checked when PVCs are not served)."""
    if ("", "persistentvolumeclaims") not in store.types:
        return []
    missing = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            try:
                store.get("", "persistentvolumeclaims", pod["metadata"]["namespace"], claim)
            except ApiError:
                missing.append(claim)
    return missing


def claim_dir(cluster_dir: Path, namespace: str, claim: str) -> Path:
    """Where a PersistentVolumeClaim's files live on the fake node (kept across pods)."""
    return cluster_dir / "pvc" / namespace / claim


def prepare_volumes(store: Store, pod: Obj, cluster_dir: Path, pod_dir: Path) -> dict[str, Path]:
    """Create each volume's directory (files for Secret/ConfigMap/downward API keys, mode 0600
    unless the spec says otherwise) and return volume name -> directory."""
    namespace, dirs = pod["metadata"]["namespace"], {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = volume["name"]
        if "persistentVolumeClaim" in volume:
            dirs[name] = claim_dir(
                cluster_dir, namespace, volume["persistentVolumeClaim"]["claimName"]
            )
        elif "hostPath" in volume:
            dirs[name] = Path(volume["hostPath"]["path"])
        else:
            dirs[name] = pod_dir / "volumes" / name
        dirs[name].mkdir(parents=True, exist_ok=True)
        sources = volume.get("projected", {}).get("sources") or [volume]
        if not any(k in volume for k in ("persistentVolumeClaim", "hostPath", "emptyDir")):
            for source in sources:
                _project(store, pod, name, source, dirs[name], volume)
    return dirs


def _project(store: Store, pod: Obj, name: str, source: Obj, into: Path, volume: Obj) -> None:
    """Write one volume source's keys as files."""
    files: dict[str, str] = {}
    default_mode = volume.get("defaultMode", (volume.get("projected") or {}).get("defaultMode"))
    for kind, key in (("secret", "secretName"), ("configMap", "name")):
        if kind in source:
            ref = source[kind]
            ref_name = ref.get(key) or ref.get("name", "")
            try:
                data = _lookup(
                    store, kind, pod["metadata"]["namespace"], ref_name, ref.get("optional")
                )
            except ConfigError as exc:
                raise ConfigError(
                    "FailedMount", f'MountVolume.SetUp failed for volume "{name}" : {exc.message}'
                ) from None
            items = ref.get("items") or [{"key": k, "path": k} for k in data]
            files.update({i["path"]: data[i["key"]] for i in items if i["key"] in data})
            default_mode = ref.get("defaultMode", default_mode)
    if "downwardAPI" in source:
        for item in source["downwardAPI"].get("items") or []:
            files[item["path"]] = field_value(pod, item.get("fieldRef", {}).get("fieldPath", ""))
    if "serviceAccountToken" in source:
        files[source["serviceAccountToken"].get("path", "token")] = "fake-service-account-token"
    known = ("secret", "configMap", "downwardAPI", "serviceAccountToken")
    if not files and not any(k in source for k in known):
        kinds = sorted(k for k in source if k not in ("name", "defaultMode"))
        raise ConfigError(
            "FailedMount", f'volume "{name}": type {kinds} is not supported by the fake kubelet'
        )
    for path, text in files.items():
        target = into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(default_mode if default_mode is not None else 0o600)


def _sub_path(volume: Path, sub: str) -> Path:
    """The directory of `volume` that `subPath` `sub` names, made if missing, as the kubelet's
    makeMounts does: refused (CreateContainerConfigError) when absolute, when it has a `..`, or
    when it leaves the volume through a symlink."""
    if not sub:
        return volume
    if os.path.isabs(sub):
        message = f"error SubPath `{sub}` must not be an absolute path"
        raise ConfigError("CreateContainerConfigError", message)
    if ".." in Path(sub).parts:
        message = f"unable to provision SubPath `{sub}`: must not contain '..'"
        raise ConfigError("CreateContainerConfigError", message)
    local = volume / sub
    if not local.resolve().is_relative_to(volume.resolve()):
        message = f"failed to prepare subPath `{sub}`: it is outside the volume {volume.name}"
        raise ConfigError("CreateContainerConfigError", message)
    local.mkdir(parents=True, exist_ok=True)
    return local


@dataclass(frozen=True)
class Mounts:
    """A container's `mountPath` -> local directory map, longest path first."""

    paths: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, container: Obj, volume_dirs: Mapping[str, Path]) -> Mounts:
        """The map for `container`; `subPath` selects a file or subdirectory of the volume."""
        paths = []
        for mount in container.get("volumeMounts") or []:
            if mount.get("name") not in volume_dirs:
                message = f'volume "{mount.get("name")}" is mounted but not defined'
                raise ConfigError("CreateContainerConfigError", message)
            local = _sub_path(volume_dirs[mount["name"]], mount.get("subPath") or "")
            path = mount["mountPath"].rstrip("/")
            if path:  # a volume mounted at / cannot be told apart from host paths
                paths.append((path, str(local)))
        return cls(tuple(sorted(paths, key=lambda p: len(p[0]), reverse=True)))

    def rewrite(self, value: str) -> str:
        """`value` with a leading mountPath replaced by its directory; also the part after the
        first `=` (`--dir=/checkpoints/x`). Other values are returned unchanged."""
        for path, local in self.paths:
            if value == path or value.startswith(path + "/"):
                return local + value[len(path) :]
        key, sep, rest = value.partition("=")
        if sep and rest.startswith("/") and not key.startswith("/"):
            return key + sep + self.rewrite(rest)
        return value

    def env(self) -> dict[str, str]:
        """`KUBE_FAKE_MOUNT_<PATH>` -> directory for each mount (`/data/ckpt` -> `DATA_CKPT`)."""
        return {
            FAKE_MOUNT_PREFIX + re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_").upper(): local
            for path, local in self.paths
        }
