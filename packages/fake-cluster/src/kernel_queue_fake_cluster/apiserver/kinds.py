"""What the API server says about objects: `ResourceType` (one kind it serves), with `Obj` (an
object as plain JSON) and the timestamps metadata carries (`common/objects.py`).

Plain data, no behaviour; the store keeps objects, `resources.py` and `crds.py` describe kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kernel_queue_fake_cluster.common.objects import Obj, now_rfc3339

__all__ = ["Obj", "ResourceType", "now_rfc3339"]


@dataclass(frozen=True)
class ResourceType:
    """One kind the server serves. Custom resources carry their OpenAPI schemas per version."""

    group: str
    plural: str
    kind: str
    namespaced: bool = True
    versions: tuple[str, ...] = ("v1",)
    status_subresource: bool = True
    builtin: bool = True  # strategic merge patch is allowed only on built-in kinds
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()  # as "all", which `kubectl get all` lists
    schemas: Mapping[str, Obj] = field(default_factory=dict)  # version -> openAPIV3Schema
    printer_columns: Mapping[str, tuple[Obj, ...]] = field(default_factory=dict)
    """version -> the CRD's additionalPrinterColumns (`tables.py`)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def storage_version(self) -> str:
        return self.versions[-1]

    def api_version(self, version: str | None = None) -> str:
        version = version or self.storage_version
        return f"{self.group}/{version}" if self.group else version
