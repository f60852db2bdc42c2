"""How the admin's ``pod_template`` is merged under the fields kernel-queue owns (pure).

``manifests`` builds our container and pod fields, then lays them over the template's: our
values win, lists of named items (env, ports, volume mounts, volumes) keep the template's items
that name nothing of ours, resource requests and limits and security contexts are merged key by
key, and the template's own containers get our security context. A template may hold anything:
what is not a mapping or a list where one is expected counts as absent.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def merge_container(ours: dict[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """``ours`` over the template's container of the same name; lists and sub-dicts merged."""
    merged = copy.deepcopy(dict(template))
    for key, value in ours.items():
        if key == "env":
            merged[key] = merge_named(value, dicts(merged.get(key)), ("name",))
        elif key == "ports":
            keys = ("name", "containerPort")
            merged[key] = merge_named(value, dicts(merged.get(key)), keys)
        elif key == "volumeMounts":
            keys = ("name", "mountPath")
            merged[key] = merge_named(value, dicts(merged.get(key)), keys)
        elif key == "resources":
            theirs = mapping(merged.get(key))
            for part in ("requests", "limits"):
                if part in value:
                    theirs[part] = {**mapping(theirs.get(part)), **value[part]}
            merged[key] = theirs
        elif key == "securityContext":
            merged[key] = {**mapping(merged.get(key)), **value}
        else:
            merged[key] = value
    return merged


def hardened(container: dict[str, Any], security: Mapping[str, Any]) -> dict[str, Any]:
    """A template's own container (a sidecar, an init container) with `security` over its
    securityContext."""
    context = {**mapping(container.get("securityContext")), **copy.deepcopy(dict(security))}
    return {**container, "securityContext": context}


def merge_named(
    ours: list[dict[str, Any]], theirs: Iterable[dict[str, Any]], keys: Sequence[str]
) -> list[dict[str, Any]]:
    """``ours``, then those of ``theirs`` that share no value of ``keys`` with ours."""
    taken = {(key, item.get(key)) for item in ours for key in keys if key in item}
    rest = [item for item in theirs if not any((key, item.get(key)) in taken for key in keys)]
    return ours + rest


def mapping(value: Any) -> dict[str, Any]:
    """A copy of `value` if it is a mapping, else an empty dict (a template may hold anything)."""
    return dict(value) if isinstance(value, Mapping) else {}


def dicts(value: Any) -> list[dict[str, Any]]:
    """Copies of the mappings in `value` if it is a list, else none."""
    return (
        [dict(item) for item in value if isinstance(item, Mapping)]
        if isinstance(value, list)
        else []
    )
