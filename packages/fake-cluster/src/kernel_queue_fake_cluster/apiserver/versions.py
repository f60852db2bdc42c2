"""One kind served at several versions: conversion between them, and validation at each.

The store keeps every object at its kind's storage version. A request at another version is
converted on the way in (its body, before admission) and on the way out (answers and watch
events) by the kind's converter, as a CRD's conversion webhook does; a kind without one changes
only `apiVersion` (a CRD's `conversion.strategy: None`). A write is validated against the schema
of the version it was sent at, then pruned and defaulted to the storage version's. The
apiserver's own path rules decide which versions a client may use; a converter may also be
asked for a version no path serves (a controller's own types), and then only the storage
version's schema applies. Converters come from whoever serves the kind (`Store.add_conversion`).
"""

from __future__ import annotations

from collections.abc import Callable

from kernel_queue_fake_cluster.apiserver import schema as openapi
from kernel_queue_fake_cluster.apiserver.errors import invalid
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType

Converter = Callable[[Obj, str], Obj]
"""`convert(obj, api_version)`: a new object, `obj` (at its own apiVersion) at `api_version` of
its kind, with that apiVersion set; it must not change `obj`."""


def unconverted(obj: Obj, api_version: str) -> Obj:
    """The object at another version with nothing but its apiVersion changed."""
    return obj if obj.get("apiVersion") == api_version else {**obj, "apiVersion": api_version}


class Versions:
    """The converters of the kinds served at more than one version, by (group, plural)."""

    def __init__(self) -> None:
        self._converters: dict[tuple[str, str], Converter] = {}

    def add(self, group: str, plural: str, converter: Converter) -> None:
        """Convert objects of (group, plural) with `converter` from now on."""
        self._converters[(group, plural)] = converter

    def at(self, rtype: ResourceType, obj: Obj, version: str = "") -> Obj:
        """`obj` at `version` of its kind ("": the storage version); `obj` itself when it
        already is, else a new object."""
        wanted = rtype.api_version(version or None)
        if obj.get("apiVersion") == wanted:
            return obj
        return self._converters.get(rtype.key, unconverted)(obj, wanted)

    def incoming(self, rtype: ResourceType, obj: Obj, version: str = "") -> Obj:
        """A request's body at `version` ("": the storage version), pruned, defaulted and
        validated against that version's schema where it has one (422 Invalid with its field
        paths), then at the storage version, as the store keeps it."""
        sent = version or rtype.storage_version
        obj = {**obj, "apiVersion": rtype.api_version(sent)}
        if sent != rtype.storage_version and sent in rtype.schemas:
            obj, causes = openapi.prune_default_validate(obj, rtype.schemas[sent])
            if causes:
                raise invalid(rtype, (obj.get("metadata") or {}).get("name", ""), causes)
        return self.at(rtype, obj)

    def validated(self, rtype: ResourceType, obj: Obj) -> Obj:
        """An object at the storage version as it is to be stored: pruned and defaulted to
        that version's schema; 422 Invalid with the field paths of what it breaks."""
        schema = rtype.schemas.get(rtype.storage_version)
        if not schema:
            return obj
        obj, causes = openapi.prune_default_validate(obj, schema)
        if causes:
            raise invalid(rtype, obj["metadata"].get("name", ""), causes)
        return obj
