"""Structural OpenAPI v3 schemas of custom resources: prune unknown fields, apply defaults and
validate, as the apiserver does before storing a custom resource, with its field paths and wording.
Checked: type, nullable, int-or-string, properties, additionalProperties, preserve-unknown-fields,
default, required, enum, min/max (+exclusive), min/maxLength, pattern, min/maxItems, uniqueItems,
maxProperties, anyOf/oneOf/allOf, list-type map/set. Skipped: x-kubernetes-validations (CEL
rules), format, multipleOf, not, and the apiVersion/kind/metadata of embedded resources."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

Schema = dict[str, Any]
Errors = list[tuple[str, str]]

# ObjectMeta's fields: the only ones kept under a custom resource's `metadata`.
# fmt: off
OBJECT_META = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields",
})
# fmt: on
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    f"for validation is '{DNS_SUBDOMAIN}')"
)


def prune_default_validate(obj: dict[str, Any], schema: Schema) -> tuple[dict[str, Any], Errors]:
    """A new object, pruned to `schema` and defaulted, and the (field path, message) violations.

    `apiVersion` and `kind` are always kept; `metadata` keeps only ObjectMeta's fields and only
    its `name` is validated (DNS subdomain, plus the schema's own `metadata.name` rules).
    """
    errors: Errors = []
    head: dict[str, Any] = {
        key: copy.deepcopy(obj[key]) for key in ("apiVersion", "kind") if key in obj
    }
    if "metadata" in obj:
        head["metadata"] = _metadata(obj["metadata"], schema, errors)
    body = {key: value for key, value in obj.items() if key not in head}
    result = _walk(body, schema, "", errors, prune=True)
    return {**head, **result}, errors


def _metadata(meta: Any, schema: Schema, errors: Errors) -> Any:
    """ObjectMeta's fields only; the name must be a DNS subdomain and obey the schema's rules."""
    if not isinstance(meta, dict):
        errors.append(_type_error("metadata", meta, "object"))
        return copy.deepcopy(meta)
    meta = {key: copy.deepcopy(value) for key, value in meta.items() if key in OBJECT_META}
    name = meta.get("name")
    if isinstance(name, str) and name:
        if len(name) > 253:
            errors.append(("metadata.name", _invalid(name, "must be no more than 253 characters")))
        if not re.fullmatch(DNS_SUBDOMAIN, name):
            errors.append(("metadata.name", _invalid(name, DNS_SUBDOMAIN_MESSAGE)))
        declared = schema.get("properties", {}).get("metadata", {}).get("properties", {})
        if "name" in declared:
            _walk(name, declared["name"], "metadata.name", errors, prune=False)
    return meta


def _walk(value: Any, schema: Schema, path: str, errors: Errors, *, prune: bool) -> Any:
    """`value` pruned and defaulted (a new value when `prune`), recording violations."""
    if value is None:
        if "type" in schema and not schema.get("nullable"):
            errors.append(_type_error(path, value, schema["type"]))
        return None
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            errors.append(_type_error(path, value, "integer,string"))
            return copy.deepcopy(value)
    elif "type" in schema and _type_name(value, schema["type"]) != schema["type"]:
        errors.append(_type_error(path, value, schema["type"]))
        return copy.deepcopy(value)
    if isinstance(value, dict):
        value = _object(value, schema, path, errors, prune=prune)
    elif isinstance(value, list):
        item_schema = schema.get("items", {})
        value = [
            _walk(item, item_schema, f"{path}[{i}]", errors, prune=prune)
            for i, item in enumerate(value)
        ]
        _check_list(value, schema, path, errors)
    else:
        _check_scalar(value, schema, path, errors)
    if "enum" in schema and value not in schema["enum"]:
        # Go quotes each allowed value; a non-string one is quoted JSON: "1", "true"
        allowed = ", ".join(
            json.dumps(v if isinstance(v, str) else json.dumps(v)) for v in schema["enum"]
        )
        errors.append((path, f"Unsupported value: {_go(value)}: supported values: {allowed}"))
    _check_combinators(value, schema, path, errors)
    return value


def _object(
    value: dict[str, Any], schema: Schema, path: str, errors: Errors, *, prune: bool
) -> dict[str, Any]:
    properties: dict[str, Schema] = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    keep_unknown = not prune or schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in properties:
            if item is None and not properties[key].get("nullable") and prune:
                continue  # a null for a non-nullable field is pruned, then defaulted
            out[key] = _walk(item, properties[key], _child(path, key), errors, prune=prune)
        elif isinstance(extra, dict):
            out[key] = _walk(item, extra, f"{path}[{key}]", errors, prune=prune)
        elif keep_unknown:
            out[key] = copy.deepcopy(item)
    if prune:
        for key, sub in properties.items():
            if key not in out and "default" in sub:
                default = copy.deepcopy(sub["default"])
                out[key] = _walk(default, sub, _child(path, key), errors, prune=True)
    for key in schema.get("required", []):
        if key not in out:
            errors.append((_child(path, key), "Required value"))
    if "maxProperties" in schema and len(out) > schema["maxProperties"]:
        limit = schema["maxProperties"]
        errors.append((path, f"Too many: {len(out)}: must have at most {limit} items"))
    return out


def _check_scalar(value: Any, schema: Schema, path: str, errors: Errors) -> None:
    """String and number keywords; each applies only to values of its kind."""
    where = f"{path} in body"
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append((path, f"Too long: may not be more than {schema['maxLength']} bytes"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            message = f"{where} should be at least {schema['minLength']} chars long"
            errors.append((path, _invalid(value, message)))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append((path, _invalid(value, f"{where} should match '{schema['pattern']}'")))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        for key, words in (("maximum", "less than"), ("minimum", "greater than")):
            if key not in schema:
                continue
            bound, strict = schema[key], schema.get(f"exclusive{key.capitalize()}", False)
            beyond = value - bound if key == "maximum" else bound - value
            if beyond > 0 or (strict and beyond == 0):
                wording = words if strict else f"{words} or equal to"
                message = f"{where} should be {wording} {_go(bound)}"
                errors.append((path, _invalid(value, message)))


def _check_list(value: list[Any], schema: Schema, path: str, errors: Errors) -> None:
    where = f"{path} in body"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        limit = schema["maxItems"]
        errors.append((path, f"Too many: {len(value)}: must have at most {limit} items"))
    if "minItems" in schema and len(value) < schema["minItems"]:
        message = f"{where} should have at least {schema['minItems']} items"
        errors.append((path, _invalid(len(value), message)))
    if schema.get("uniqueItems") and _has_duplicates(value):
        errors.append((path, _invalid("", f"{where} shouldn't contain duplicates")))
    list_type = schema.get("x-kubernetes-list-type")
    seen: list[Any] = []
    for i, item in enumerate(value):
        if list_type == "set":
            key = item
        elif list_type == "map" and isinstance(item, dict):
            names = schema.get("x-kubernetes-list-map-keys", [])
            if not any(name in item for name in names):
                continue  # no key at all: reported as a missing required key instead
            key = {name: item[name] for name in names if name in item}
        else:
            continue
        if key in seen:
            errors.append((f"{path}[{i}]", f"Duplicate value: {_go(key)}"))
        else:
            seen.append(key)


def _check_combinators(value: Any, schema: Schema, path: str, errors: Errors) -> None:
    """anyOf: at least one branch holds; oneOf: exactly one; allOf: all (branches never prune)."""
    for keyword in ("anyOf", "oneOf", "allOf"):
        if keyword not in schema:
            continue
        results: list[Errors] = []
        for branch in schema[keyword]:
            branch_errors: Errors = []
            _walk(value, branch, path, branch_errors, prune=False)
            results.append(branch_errors)
        passing = sum(1 for result in results if not result)
        if keyword == "allOf":
            errors.extend(error for result in results for error in result)
        elif keyword == "anyOf" and passing == 0:
            errors.extend(error for result in results for error in result)
            message = f"{path} in body must validate at least one schema (anyOf)"
            errors.append((path, _invalid(value, message)))
        elif keyword == "oneOf" and passing != 1:
            message = f"{path} in body must validate one and only one schema (oneOf)"
            errors.append((path, _invalid(value, message)))


def _has_duplicates(items: list[Any]) -> bool:
    return any(item in items[:i] for i, item in enumerate(items))


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(value: Any, declared: str) -> str:
    """The JSON type of `value`; an int is also a `number` when a number is declared."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "number" if declared == "number" else "integer"
    names = {float: "number", str: "string", dict: "object", list: "array"}
    return next((name for t, name in names.items() if isinstance(value, t)), "null")


def _type_error(path: str, value: Any, expected: str) -> tuple[str, str]:
    actual = _type_name(value, "")
    return path, _invalid(actual, f'{path} in body must be of type {expected}: "{actual}"')


def _invalid(value: Any, message: str) -> str:
    return f"Invalid value: {_go(value)}: {message}"


def _go(value: Any) -> str:
    """A value as the apiserver prints it in an error (Go's %q for strings, %#v for the rest)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value).removesuffix(".0")
    if isinstance(value, dict):
        inner = ", ".join(f"{json.dumps(k)}:{_go(v)}" for k, v in sorted(value.items()))
        return f"map[string]interface {{}}{{{inner}}}"
    if isinstance(value, list):
        return f"[]interface {{}}{{{', '.join(_go(v) for v in value)}}}"
    return str(value)
