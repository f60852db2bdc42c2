"""What a container's environment is, as the kubelet builds it from the pod spec.

`container_env` resolves literals, `$(VAR)` references, Secrets and ConfigMaps (`envFrom`,
`secretKeyRef`, `configMapKeyRef`), the downward API (`field_value`) and resource fields, and
rewrites values through the container's `Mounts`. `ConfigError` is a container that cannot start
yet, with the waiting reason the kubelet reports. No processes and no status writes here.
"""

from __future__ import annotations

import base64
import math
import os
import re
from collections.abc import Mapping
from typing import Any, Protocol

from kernel_queue import quantities

from kernel_queue_fake_cluster.common.objects import Obj


class Objects(Protocol):
    """What the agent knows of the objects a pod refers to (its informers' caches)."""

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        """The object (`secrets`, `configmaps`, `persistentvolumeclaims`), None if absent."""
        ...

    def served(self, plural: str) -> bool:
        """Whether the API server serves the kind at all."""
        ...


class Mounts(Protocol):
    """A container's mount paths, as `volumes.Mounts` maps them to local directories."""

    def rewrite(self, value: str) -> str:
        """`value` with a leading mountPath replaced by its directory."""
        ...

    def env(self) -> dict[str, str]:
        """One variable per mount, naming its directory."""
        ...


class ConfigError(Exception):
    """A container cannot start yet (its waiting reason and message, as the kubelet reports)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


def container_env(
    objects: Objects, pod: Obj, container: Obj, mounts: Mounts, base: Mapping[str, str]
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
                data = lookup(objects, kind, namespace, ref.get("name", ""), ref.get("optional"))
                for key, value in (data or {}).items():
                    name = source.get("prefix", "") + key
                    env[name] = raw[name] = value
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" in item:
            found = _value_from(objects, pod, container, item["valueFrom"])
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


def lookup(objects: Objects, kind: str, namespace: str, name: str, optional: Any) -> dict[str, str]:
    """Decoded data of a Secret (`secretRef`/`secretKeyRef`/`secret`) or ConfigMap, or {}."""
    found = lookup_bytes(objects, kind, namespace, name, optional)
    return {k: v.decode("utf-8", errors="replace") for k, v in found.items()}


def lookup_bytes(
    objects: Objects, kind: str, namespace: str, name: str, optional: Any
) -> dict[str, bytes]:
    """`lookup`, each value as the bytes it stands for (a ConfigMap's binaryData exactly)."""
    secret = kind.startswith("secret")
    plural = "secrets" if secret else "configmaps"
    obj = objects.get(plural, namespace, name)
    if obj is None:
        if optional:
            return {}
        raise ConfigError(
            "CreateContainerConfigError",
            f'{"secret" if secret else "configmap"} "{name}" not found',
        ) from None
    data = {k: _decode(v) for k, v in (obj.get("data") or {}).items()} if secret else {}
    if not secret:
        data = {k: _decode(v) for k, v in (obj.get("binaryData") or {}).items()}
        data.update({k: str(v).encode() for k, v in (obj.get("data") or {}).items()})
    data.update({k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
    return data


def _decode(value: Any) -> bytes:
    return base64.b64decode(str(value))


def _value_from(objects: Objects, pod: Obj, container: Obj, source: Obj) -> str | None:
    namespace = pod["metadata"]["namespace"]
    for kind, label in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
        if kind in source:
            ref = source[kind]
            data = lookup(objects, kind, namespace, ref.get("name", ""), ref.get("optional"))
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
