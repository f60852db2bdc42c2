"""A pod's volumes on the fake node: local directories, and where each container sees them.

`prepare_volumes` makes each volume's directory (a claim's files kept under the cluster's
`pvc/`, the others under the pod's own directory, Secret, ConfigMap and downward API keys
written as files); `Mounts` maps a container's `mountPath`s (and `subPath`s) to them, so paths
in its command, env and working directory can be rewritten. No processes here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kernel_queue_fake_cluster.common.objects import Obj
from kernel_queue_fake_cluster.node import pod_env
from kernel_queue_fake_cluster.node.pod_env import Objects

FAKE_MOUNT_PREFIX = "KUBE_FAKE_MOUNT_"


def missing_claims(objects: Objects, pod: Obj) -> list[str]:
    """Claims the pod needs that do not exist (not checked when PVCs are not served)."""
    return [name for name, claim in _claims(objects, pod) if claim is None]


def unbound_claims(objects: Objects, pod: Obj) -> list[str]:
    """Claims the pod needs whose status says Pending: no volume bound to them (the fake cluster
    binds a claim of no storage class at once, `apiserver/claim_rules.py`; on a real plane the
    binder binds it to the volume `provisioner.py` makes)."""
    return [
        name
        for name, claim in _claims(objects, pod)
        if claim is not None and (claim.get("status") or {}).get("phase") == "Pending"
    ]


def _claims(objects: Objects, pod: Obj) -> list[tuple[str, Obj | None]]:
    """The pod's claims by name, each with its object (None where it does not exist)."""
    if not objects.served("persistentvolumeclaims"):
        return []
    found: list[tuple[str, Obj | None]] = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if name:
            claim = objects.get("persistentvolumeclaims", pod["metadata"]["namespace"], name)
            found.append((name, claim))
    return found


def claim_dir(cluster_dir: Path, namespace: str, claim: str) -> Path:
    """Where a PersistentVolumeClaim's files live on the fake node (kept across pods)."""
    return cluster_dir / "pvc" / namespace / claim


def prepare_volumes(
    objects: Objects, pod: Obj, cluster_dir: Path, pod_dir: Path
) -> dict[str, Path]:
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
                _project(objects, pod, name, source, dirs[name], volume)
    return dirs


def _project(objects: Objects, pod: Obj, name: str, source: Obj, into: Path, volume: Obj) -> None:
    """Write one volume source's keys as files."""
    files: dict[str, bytes] = {}
    default_mode = volume.get("defaultMode", (volume.get("projected") or {}).get("defaultMode"))
    for kind, key in (("secret", "secretName"), ("configMap", "name")):
        if kind in source:
            ref = source[kind]
            ref_name = ref.get(key) or ref.get("name", "")
            try:
                data = pod_env.lookup_bytes(
                    objects, kind, pod["metadata"]["namespace"], ref_name, ref.get("optional")
                )
            except pod_env.ConfigError as exc:
                raise pod_env.ConfigError(
                    "FailedMount", f'MountVolume.SetUp failed for volume "{name}" : {exc.message}'
                ) from None
            items = ref.get("items") or [{"key": k, "path": k} for k in data]
            files.update({i["path"]: data[i["key"]] for i in items if i["key"] in data})
            default_mode = ref.get("defaultMode", default_mode)
    if "downwardAPI" in source:
        for item in source["downwardAPI"].get("items") or []:
            files[item["path"]] = pod_env.field_value(
                pod, item.get("fieldRef", {}).get("fieldPath", "")
            ).encode()
    if "serviceAccountToken" in source:
        files[source["serviceAccountToken"].get("path", "token")] = b"fake-service-account-token"
    known = ("secret", "configMap", "downwardAPI", "serviceAccountToken")
    if not files and not any(k in source for k in known):
        kinds = sorted(k for k in source if k not in ("name", "defaultMode"))
        raise pod_env.ConfigError(
            "FailedMount", f'volume "{name}": type {kinds} is not supported by the fake kubelet'
        )
    for path, content in files.items():
        target = into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():  # a read-only file of an earlier try
            target.unlink()
        target.write_bytes(content)
        target.chmod(default_mode if default_mode is not None else 0o600)


def _sub_path(volume: Path, sub: str) -> Path:
    """The directory of `volume` that `subPath` `sub` names, made if missing, as the kubelet's
    makeMounts does: refused (CreateContainerConfigError) when absolute, when it has a `..`, or
    when it leaves the volume through a symlink."""
    if not sub:
        return volume
    if os.path.isabs(sub):
        message = f"error SubPath `{sub}` must not be an absolute path"
        raise pod_env.ConfigError("CreateContainerConfigError", message)
    if ".." in Path(sub).parts:
        message = f"unable to provision SubPath `{sub}`: must not contain '..'"
        raise pod_env.ConfigError("CreateContainerConfigError", message)
    local = volume / sub
    if not local.resolve().is_relative_to(volume.resolve()):
        message = f"failed to prepare subPath `{sub}`: it is outside the volume {volume.name}"
        raise pod_env.ConfigError("CreateContainerConfigError", message)
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
                raise pod_env.ConfigError("CreateContainerConfigError", message)
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
