"""What an update may change of a stored object, as the apiserver's update strategies decide.

A write to the main resource of a kind with a status subresource keeps the stored `.status`; a
`/status` write changes only `.status`; neither touches the metadata the apiserver owns (name,
namespace, uid, timestamps, generation, resourceVersion) or the type. `generation` moves only
when what `spec` returns changes. Pure functions; the store applies them inside each write.
"""

from __future__ import annotations

import copy

from kernel_queue_fake_cluster.apiserver.errors import ApiError, invalid
from kernel_queue_fake_cluster.apiserver.kinds import Obj, ResourceType

OWNED_METADATA = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "resourceVersion",
)
"""Metadata a client cannot change with an update: the stored value stays, or stays absent."""


def merged(rtype: ResourceType, old: Obj, new: Obj, subresource: str) -> Obj:
    """`new` (a PUT or patched body, which it may change) over the stored `old`, as the update
    is to store it; 404 for a subresource other than "" and "status"."""
    if subresource not in ("", "status", "binding"):
        raise ApiError(
            404, "NotFound", f"the server could not find the requested resource ({subresource})"
        )
    uid = (new.get("metadata") or {}).get("uid")
    if uid and uid != old["metadata"].get("uid"):  # "use the existing UID if none is provided"
        name = old["metadata"]["name"]
        raise invalid(
            rtype, name, [("metadata.uid", f'Invalid value: "{uid}": field is immutable')]
        )
    if subresource == "binding":  # the apiserver's own write: spec.nodeName and the status
        node, status = (new.get("spec") or {}).get("nodeName"), new.get("status")
        new = copy.deepcopy(old)
        new["spec"]["nodeName"], new["status"] = node, status
    elif subresource == "status":
        status = new.get("status")
        new = copy.deepcopy(old)
        if status is None:
            new.pop("status", None)
        else:
            new["status"] = status
    elif rtype.status_subresource and "status" in old:
        new["status"] = copy.deepcopy(old["status"])
    elif rtype.status_subresource:
        new.pop("status", None)
    meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
    for kept in OWNED_METADATA:
        if kept in old_meta:
            meta[kept] = old_meta[kept]
        else:
            meta.pop(kept, None)
    new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
    return new


def spec(obj: Obj) -> Obj:
    """Everything but metadata and status: what bumps `generation` when it changes."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}
