"""The kinds a fresh fake cluster serves: built-in core and RBAC types, and Kueue's CRDs.

Owns the `ResourceType` table for built-in kinds and registers it with the CRDs `crds.py`
reads. It only describes and registers types; serving them is `server.py`'s job and storing
them `store.py`'s.
"""

from __future__ import annotations

from collections.abc import Iterable

from kernel_queue_fake_cluster.apiserver import crds as crd_files
from kernel_queue_fake_cluster.apiserver import secrets
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import ResourceType
from kernel_queue_fake_cluster.apiserver.store import Store

RBAC_GROUP = "rbac.authorization.k8s.io"


def _core(
    plural: str,
    kind: str,
    short: tuple[str, ...] = (),
    *,
    status: bool = False,
    categories: tuple[str, ...] = (),
) -> ResourceType:
    return ResourceType(
        group="",
        plural=plural,
        kind=kind,
        status_subresource=status,
        singular=kind.lower(),
        short_names=short,
        categories=categories,
    )


BUILTIN: tuple[ResourceType, ...] = (
    _core("pods", "Pod", ("po",), status=True, categories=("all",)),
    _core("services", "Service", ("svc",), status=True, categories=("all",)),
    _core("endpoints", "Endpoints", ("ep",)),
    _core("secrets", "Secret"),
    _core("configmaps", "ConfigMap", ("cm",)),
    _core("events", "Event", ("ev",)),
    _core("persistentvolumeclaims", "PersistentVolumeClaim", ("pvc",), status=True),
    _core("serviceaccounts", "ServiceAccount", ("sa",)),
    ResourceType(
        "",
        "nodes",
        "Node",
        namespaced=False,
        singular="node",
        short_names=("no",),
    ),
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
"""Built-in kinds; pods, services, nodes and PVCs have a status subresource."""


def install(
    store: Store,
    *,
    crds: Iterable[ResourceType] | None = None,
    namespaces: Iterable[str] = ("default", "kube-system"),
) -> None:
    """Register the built-in kinds and `crds` (None: those `crd_files.load()` finds; `()` for
    none), the apiserver's Secret rules (`secrets.py`), and create the namespaces a fresh
    cluster has. Runs on the store's loop (or before it starts)."""
    for rtype in BUILTIN:
        store.register(rtype)
    secrets.install(store)
    for rtype in crd_files.load() if crds is None else crds:
        store.register(rtype)
    for name in namespaces:
        try:
            store.create("", "namespaces", None, {"metadata": {"name": name}})
        except ApiError as exc:
            if exc.code != 409:
                raise
