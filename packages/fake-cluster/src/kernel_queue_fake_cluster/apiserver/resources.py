"""The kinds a fresh fake cluster serves: built-in core and RBAC types, and Kueue's CRDs.

Owns the `ResourceType` table for built-in kinds and reads CRD manifests into `ResourceType`s
(all served versions over the same objects, schemas per version). It only describes and
registers types; serving them is `server.py`'s job and storing them `store.py`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from kernel_queue_fake_cluster.apiserver.store import ApiError, ResourceType, Store

KUEUE_CRDS = Path(__file__).resolve().parents[5].parent / "shared" / "data" / "kueue" / "crds"
"""The Kueue CRD manifests next to the repository (`../shared/data/kueue/crds`)."""

RBAC_GROUP = "rbac.authorization.k8s.io"


def _core(
    plural: str, kind: str, short: tuple[str, ...] = (), *, status: bool = False
) -> ResourceType:
    return ResourceType(
        group="",
        plural=plural,
        kind=kind,
        status_subresource=status,
        singular=kind.lower(),
        short_names=short,
    )


BUILTIN: tuple[ResourceType, ...] = (
    _core("pods", "Pod", ("po",), status=True),
    _core("services", "Service", ("svc",), status=True),
    _core("endpoints", "Endpoints", ("ep",)),
    _core("secrets", "Secret"),
    _core("configmaps", "ConfigMap", ("cm",)),
    _core("events", "Event", ("ev",)),
    _core("persistentvolumeclaims", "PersistentVolumeClaim", ("pvc",), status=True),
    _core("serviceaccounts", "ServiceAccount", ("sa",)),
    ResourceType(
        "",
        "namespaces",
        "Namespace",
        namespaced=False,
        singular="namespace",
        short_names=("ns",),
    ),
    *(
        ResourceType(
            RBAC_GROUP,
            plural,
            kind,
            namespaced=namespaced,
            status_subresource=False,
            singular=kind.lower(),
        )
        for plural, kind, namespaced in (
            ("roles", "Role", True),
            ("rolebindings", "RoleBinding", True),
            ("clusterroles", "ClusterRole", False),
            ("clusterrolebindings", "ClusterRoleBinding", False),
        )
    ),
)
"""Built-in kinds; pods, services, namespaces and PVCs have a status subresource."""


def crd_type(crd: dict[str, Any]) -> ResourceType:
    """A `ResourceType` for one CustomResourceDefinition manifest (served versions only,
    the storage version last, as `ResourceType.storage_version` expects)."""
    spec = crd["spec"]
    names = spec["names"]
    served = [v for v in spec["versions"] if v.get("served", True)]
    served.sort(key=lambda v: bool(v.get("storage")))
    return ResourceType(
        group=spec["group"],
        plural=names["plural"],
        kind=names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        versions=tuple(v["name"] for v in served),
        status_subresource=any("status" in (v.get("subresources") or {}) for v in served),
        builtin=False,
        singular=names.get("singular", names["kind"].lower()),
        short_names=tuple(names.get("shortNames") or ()),
        schemas={
            v["name"]: v["schema"]["openAPIV3Schema"]
            for v in served
            if (v.get("schema") or {}).get("openAPIV3Schema")
        },
    )


@functools.cache
def _load(directory: str) -> tuple[ResourceType, ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the Workload CRD is 1.4 MB
    found = []
    for path in sorted(Path(directory).glob("*.y*ml")):
        with path.open(encoding="utf-8") as stream:
            for document in yaml.load_all(stream, Loader=loader):
                if document and document.get("kind") == "CustomResourceDefinition":
                    found.append(crd_type(document))
    return tuple(found)


def load_crds(directory: Path | str = KUEUE_CRDS) -> list[ResourceType]:
    """Every CRD in the YAML files of `directory` (multi-document files too); cached per path,
    so the schemas are shared and must be treated as read-only."""
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"no CRD directory at {directory}")
    return list(_load(str(Path(directory).resolve())))


def install(
    store: Store,
    *,
    crds: Path | str | None = KUEUE_CRDS,
    namespaces: Iterable[str] = ("default", "kube-system"),
) -> None:
    """Register the built-in kinds and the CRDs of `crds` (None: none), and create the
    namespaces a fresh cluster has. Runs on the store's loop (or before it starts)."""
    for rtype in BUILTIN:
        store.register(rtype)
    for rtype in load_crds(crds) if crds is not None else ():
        store.register(rtype)
    for name in namespaces:
        try:
            store.create("", "namespaces", None, {"metadata": {"name": name}})
        except ApiError as exc:
            if exc.code != 409:
                raise
