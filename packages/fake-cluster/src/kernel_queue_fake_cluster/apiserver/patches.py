"""PATCH bodies for the fake API server: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and
strategic merge patch (built-in kinds only), chosen by Content-Type as the real apiserver does.

Strategic merge knows the merge keys of the lists this project touches; `$retainKeys` is ignored
and `$setElementOrder/<list>` is accepted and ignored. Errors are `ApiError`s with real codes.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from kernel_queue_fake_cluster.apiserver.errors import ApiError

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Lists merged element by element under strategic merge (field name -> merge key).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",  # the real merge key; names are not unique in a container
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "ports": "containerPort",  # container ports; Service ports (no containerPort) use "port"
}
SET_LISTS = {"finalizers"}  # lists of strings merged as sets
_DELETE = object()  # what a `{"$patch": "delete"}` map merges to


def apply(
    current: dict[str, Any], body: Any, content_type: str, *, strategic: bool
) -> dict[str, Any]:
    """A new object: `current` patched with `body`; `current` itself is left unchanged.

    JSON patch: 400 if the body is not a list of objects (the apiserver cannot decode it), 422
    Invalid when an operation fails (a `test` that does not hold, a missing path): the apiserver
    answers 422 for every error from applying a decoded JSON patch.
    Merge and strategic merge: 400 if the body is not an object. 415 for SMP on custom resources,
    for server-side apply and for any other media type.
    """
    media = content_type.split(";", 1)[0].strip().lower()
    if media == JSON_PATCH:
        if not isinstance(body, list):
            raise ApiError(400, "BadRequest", _unmarshal_message(body, "jsonpatch.Patch"))
        for op in body:
            if not isinstance(op, dict):
                raise ApiError(400, "BadRequest", _unmarshal_message(op, "jsonpatch.Operation"))
        try:
            patched = jsonpatch.apply_patch(current, body, in_place=False)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise ApiError(422, "Invalid", str(exc)) from None
        if not isinstance(patched, dict):
            raise ApiError(400, "BadRequest", "the patched object is not a JSON object")
        return patched
    if media == MERGE_PATCH or (media == STRATEGIC and strategic):
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", _unmarshal_message(body, "map[string]interface {}"))
        merge = _merge if media == MERGE_PATCH else _strategic_map
        merged = merge(copy.deepcopy(current), body)
        return merged if isinstance(merged, dict) else {}  # {"$patch": "delete"} at the top
    if media == APPLY_PATCH:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            "server-side apply (application/apply-patch+yaml) is not supported by the fake API "
            "server",
        )
    accepted = [JSON_PATCH, MERGE_PATCH, *([STRATEGIC] if strategic else []), APPLY_PATCH]
    raise ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )


def _unmarshal_message(body: Any, go_type: str) -> str:
    """The Go decoder's complaint about a body of the wrong JSON type."""
    kinds = {dict: "object", list: "array", str: "string", bool: "bool", type(None): "null"}
    kind = next((name for t, name in kinds.items() if isinstance(body, t)), "number")
    return f"json: cannot unmarshal {kind} into Go value of type {go_type}"


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _strategic_map(target: dict[str, Any], patch: dict[str, Any]) -> Any:
    """Merge `patch` into `target` (changed in place and returned), or `_DELETE`."""
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return _strip(patch)
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(target.get(name), list):
                target[name] = [item for item in target[name] if item not in value]
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $patch, $retainKeys (ignored), $setElementOrder/ (ignored), $deleteFrom…
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            current = target.get(key)
            merged = _strategic_map(current if isinstance(current, dict) else {}, value)
            if merged is _DELETE:
                target.pop(key, None)
            else:
                target[key] = merged
        elif isinstance(value, list):
            target[key] = _strategic_list(key, target.get(key), value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def _strategic_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    """Merge a list: by merge key, as a set of strings, or (any other list) replace it whole."""
    plain = [item for item in patch if not (isinstance(item, dict) and set(item) == {"$patch"})]
    if any(isinstance(item, dict) and item == {"$patch": "replace"} for item in patch):
        return [_strip(item) if isinstance(item, dict) else item for item in plain]
    result = copy.deepcopy(current) if isinstance(current, list) else []
    if field in SET_LISTS:
        return result + [item for item in plain if item not in result]
    if field not in MERGE_KEYS:
        return copy.deepcopy(plain)
    for item in plain:
        if not isinstance(item, dict):
            continue
        key = MERGE_KEYS[field]
        if field == "ports" and key not in item:
            key = "port"
        found = next(
            (
                i
                for i, old in enumerate(result)
                if isinstance(old, dict) and old.get(key) == item.get(key)
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if found is not None:
                del result[found]
        elif found is None:
            result.append(_strategic_map({}, item))
        else:
            result[found] = _strategic_map(result[found], item)
    return result


def _strip(value: Any) -> Any:
    """A deep copy without patch directives (`$`-keys), for content that replaces or is added."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip(item) for item in value]
    return value
