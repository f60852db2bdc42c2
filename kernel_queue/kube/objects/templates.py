"""How the admin's ``pod_template`` is merged under the fields kernel-queue owns (pure).

``manifests`` builds our container and pod fields, then lays them over the template's: our
values win, lists of named items (env, ports, volume mounts, volumes) keep the template's items
that name nothing of ours, resource requests and limits and security contexts are merged key by
key, and the template's own containers get our security context. A template may hold anything:
what is not a mapping or a list where one is expected counts as absent.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any


def merge_container(
    ours: dict[str, Any], template: Mapping[str, Any], allowed: Collection[str] = ()
) -> dict[str, Any]:
    """``ours`` over the template's container of the same name; lists and sub-dicts merged;
    the securityContext by `secured` (`allowed`: the exceptions the server's admin allows)."""
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
            merged[key] = secured(mapping(merged.get(key)), value, allowed)
        else:
            merged[key] = value
    return merged


def hardened(
    container: dict[str, Any], security: Mapping[str, Any], allowed: Collection[str] = ()
) -> dict[str, Any]:
    """A template's own container (a sidecar, an init container) hardened with `security`
    (`secured`)."""
    context = secured(mapping(container.get("securityContext")), security, allowed)
    return {**container, "securityContext": context}


CONTAINER_EXCEPTIONS = ("privileged", "allowPrivilegeEscalation", "runAsNonRoot")
"""pod_template rules whose field, where the server's admin allows the rule, the template
keeps over the hardening (`capabilities` adds to the hardening's drop)."""


def secured(
    theirs: Mapping[str, Any], ours: Mapping[str, Any], allowed: Collection[str] = ()
) -> dict[str, Any]:
    """A container's securityContext: the template's, with the hardening `ours` over it, except
    where the server's admin allows the rule (`allowed`, `c.PodTemplatePolicy.
    allowed_exceptions`): then the template's field stays, and capabilities it adds are added
    to those the hardening drops (ALL). A container let be privileged is not also told
    `allowPrivilegeEscalation: false`, a pair the API server refuses in any namespace."""
    merged = {**copy.deepcopy(dict(theirs)), **copy.deepcopy(dict(ours))}
    for rule in CONTAINER_EXCEPTIONS:
        if rule in allowed and rule in theirs:
            merged[rule] = copy.deepcopy(theirs[rule])
    given = mapping(theirs.get("capabilities"))
    if "capabilities" in allowed and isinstance(given.get("add"), list):
        merged["capabilities"] = {**mapping(merged.get("capabilities")), "add": list(given["add"])}
    if "privileged" not in allowed:
        merged.pop("privileged", None)  # (the policy refused it before; never in a pod)
    elif merged.get("privileged") is True and merged.get("allowPrivilegeEscalation") is False:
        del merged["allowPrivilegeEscalation"]
    return merged


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
