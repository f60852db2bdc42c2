"""Kueue's CustomResourceDefinitions for the fake cluster: where they come from, how they are read.

Nothing of Kueue ships with the fake. The CRDs come from the path a caller gives, else from the
environment variable KERNEL_QUEUE_FAKE_CLUSTER_CRDS: a directory of CRD YAML files (Kueue's
`config/components/crd/bases`) or one multi-document YAML file such as the `manifests.yaml` of a
Kueue release, of which only the CustomResourceDefinition documents are read. Without either,
`load` raises `CrdsNotFound` saying how to give one. Each CRD becomes a `ResourceType`: every
served version over the same objects, with that version's OpenAPI schema.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Literal

import yaml

from kernel_queue_fake_cluster.apiserver.kinds import ResourceType

ENVIRONMENT_VARIABLE = "KERNEL_QUEUE_FAKE_CLUSTER_CRDS"
RELEASE_MANIFESTS = (
    "https://github.com/kubernetes-sigs/kueue/releases/download/vX.Y.Z/manifests.yaml"
)
HOW_TO_GIVE = (
    "pass crds=PATH (--crds PATH to `jupyter kernel-queue fake-cluster`), or set "
    f"{ENVIRONMENT_VARIABLE}, to a directory of Kueue's CRD files or to Kueue's release "
    f"manifests.yaml ({RELEASE_MANIFESTS})"
)

Source = str | os.PathLike[str] | Literal[False] | None
"""A path (directory or YAML file); None: the path in $KERNEL_QUEUE_FAKE_CLUSTER_CRDS; False:
no CRDs at all (a cluster of built-in kinds only)."""


class CrdsNotFound(FileNotFoundError):
    """No Kueue CRDs: none was given, the path given does not exist, or it holds no
    CustomResourceDefinition. The message says which path, where it came from, and how to give
    one."""


def locate(crds: str | os.PathLike[str] | None = None) -> Path:
    """The path of the CRDs: `crds`, else $KERNEL_QUEUE_FAKE_CLUSTER_CRDS (an empty value
    counts as unset); CrdsNotFound when neither is given or the path does not exist."""
    if crds is not None:
        path, origin = Path(crds), "crds"
    elif value := os.environ.get(ENVIRONMENT_VARIABLE):
        path, origin = Path(value), f"${ENVIRONMENT_VARIABLE}"
    else:
        raise CrdsNotFound(
            f"The fake cluster needs Kueue's CRDs and none was given: {HOW_TO_GIVE}."
        )
    if not path.exists():
        raise CrdsNotFound(f"No Kueue CRDs at {path} (from {origin}): {HOW_TO_GIVE}.")
    return path


def load(crds: Source = None) -> list[ResourceType]:
    """A `ResourceType` per CustomResourceDefinition of the source (`locate`), [] for False.
    Cached per path, so the schemas are shared and must be treated as read-only."""
    if crds is False:
        return []
    path = locate(crds)
    found = _load(str(path.resolve()))
    if not found:
        raise CrdsNotFound(f"No CustomResourceDefinition in {path}: {HOW_TO_GIVE}.")
    return list(found)


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
        categories=tuple(names.get("categories") or ()),
        schemas={
            v["name"]: v["schema"]["openAPIV3Schema"]
            for v in served
            if (v.get("schema") or {}).get("openAPIV3Schema")
        },
        printer_columns={v["name"]: tuple(v.get("additionalPrinterColumns") or ()) for v in served},
    )


@functools.cache
def _load(path: str) -> tuple[ResourceType, ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the Workload CRD is 1.4 MB
    source = Path(path)
    files = sorted(source.glob("*.y*ml")) if source.is_dir() else [source]
    found = []
    for file in files:
        with file.open(encoding="utf-8") as stream:
            for document in yaml.load_all(stream, Loader=loader):
                if document and document.get("kind") == "CustomResourceDefinition":
                    found.append(crd_type(document))
    return tuple(found)
