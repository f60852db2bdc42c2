"""Request bodies in Kubernetes' protobuf encoding, read into the JSON objects the store keeps.

kubectl's typed clients (`kubectl create namespace | secret | configmap | serviceaccount |
service | role | rolebinding | clusterrole | clusterrolebinding`) send
built-in kinds as `application/vnd.kubernetes.protobuf`: the magic `k8s\\0`, then a
`runtime.Unknown` with the object's TypeMeta and its own protobuf bytes. A real apiserver reads
them, and client-go never falls back to JSON after a 415 for protobuf (kubernetes#86253), so the
fake reads the kinds kubectl creates, from a table of their fields (the numbers of k8s.io/api's
and apimachinery's generated.proto). Another kind in protobuf is 415, naming the kinds it
reads. Replies stay JSON, which clients accept (they send `Accept: ...protobuf,application/json`).
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Mapping
from typing import Any, Union

from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

Kind = Union[str, "Message"]
"""A scalar ("string", "bytes", "int", "bool", "time", "map:string", "map:bytes") or a
message's field table."""
Message = Mapping[int, tuple[str, Kind, bool]]
"""Field number → (JSON name, kind, repeated)."""

_TYPE_META: Message = {1: ("apiVersion", "string", False), 2: ("kind", "string", False)}
_UNKNOWN: Message = {
    1: ("typeMeta", _TYPE_META, False),
    2: ("raw", "raw", False),
    3: ("contentEncoding", "string", False),
    4: ("contentType", "string", False),
}
_OWNER_REFERENCE: Message = {
    5: ("apiVersion", "string", False),
    1: ("kind", "string", False),
    3: ("name", "string", False),
    4: ("uid", "string", False),
    6: ("controller", "bool", False),
    7: ("blockOwnerDeletion", "bool", False),
}
_OBJECT_META: Message = {
    1: ("name", "string", False),
    2: ("generateName", "string", False),
    3: ("namespace", "string", False),
    5: ("uid", "string", False),
    6: ("resourceVersion", "string", False),
    7: ("generation", "int", False),
    8: ("creationTimestamp", "time", False),
    9: ("deletionTimestamp", "time", False),
    10: ("deletionGracePeriodSeconds", "int", False),
    11: ("labels", "map:string", False),
    12: ("annotations", "map:string", False),
    13: ("ownerReferences", _OWNER_REFERENCE, True),
    14: ("finalizers", "string", True),
}
_OBJECT_REFERENCE: Message = {
    1: ("kind", "string", False),
    2: ("namespace", "string", False),
    3: ("name", "string", False),
    4: ("uid", "string", False),
    5: ("apiVersion", "string", False),
    6: ("resourceVersion", "string", False),
    7: ("fieldPath", "string", False),
}
_POLICY_RULE: Message = {
    1: ("verbs", "string", True),
    2: ("apiGroups", "string", True),
    3: ("resources", "string", True),
    4: ("resourceNames", "string", True),
    5: ("nonResourceURLs", "string", True),
}
_SUBJECT: Message = {
    1: ("kind", "string", False),
    2: ("apiGroup", "string", False),
    3: ("name", "string", False),
    4: ("namespace", "string", False),
}
_ROLE_REF: Message = {
    1: ("apiGroup", "string", False),
    2: ("kind", "string", False),
    3: ("name", "string", False),
}
_SERVICE_PORT: Message = {
    1: ("name", "string", False),
    2: ("protocol", "string", False),
    6: ("appProtocol", "string", False),
    3: ("port", "int", False),
    4: ("targetPort", "intstr", False),
    5: ("nodePort", "int", False),
}
_SERVICE_SPEC: Message = {
    1: ("ports", _SERVICE_PORT, True),
    2: ("selector", "map:string", False),
    3: ("clusterIP", "string", False),
    18: ("clusterIPs", "string", True),
    4: ("type", "string", False),
    5: ("externalIPs", "string", True),
    7: ("sessionAffinity", "string", False),
    8: ("loadBalancerIP", "string", False),
    9: ("loadBalancerSourceRanges", "string", True),
    10: ("externalName", "string", False),
    11: ("externalTrafficPolicy", "string", False),
    12: ("healthCheckNodePort", "int", False),
    13: ("publishNotReadyAddresses", "bool", False),
    19: ("ipFamilies", "string", True),
    17: ("ipFamilyPolicy", "string", False),
    20: ("allocateLoadBalancerNodePorts", "bool", False),
    21: ("loadBalancerClass", "string", False),
    22: ("internalTrafficPolicy", "string", False),
    23: ("trafficDistribution", "string", False),
}
_METADATA = (1, ("metadata", _OBJECT_META, False))
_RULES = (2, ("rules", _POLICY_RULE, True))
_BINDING = [_METADATA, (2, ("subjects", _SUBJECT, True)), (3, ("roleRef", _ROLE_REF, False))]
_RBAC = "rbac.authorization.k8s.io/v1"
KINDS: Mapping[tuple[str, str], Message] = {
    ("v1", "Namespace"): dict(
        [
            _METADATA,
            (2, ("spec", {1: ("finalizers", "string", True)}, False)),
            (3, ("status", {1: ("phase", "string", False)}, False)),
        ]
    ),
    ("v1", "Secret"): dict(
        [
            _METADATA,
            (2, ("data", "map:bytes", False)),
            (3, ("type", "string", False)),
            (4, ("stringData", "map:string", False)),
            (5, ("immutable", "bool", False)),
        ]
    ),
    ("v1", "ConfigMap"): dict(
        [
            _METADATA,
            (2, ("data", "map:string", False)),
            (3, ("binaryData", "map:bytes", False)),
            (4, ("immutable", "bool", False)),
        ]
    ),
    ("v1", "ServiceAccount"): dict(
        [
            _METADATA,
            (2, ("secrets", _OBJECT_REFERENCE, True)),
            (3, ("imagePullSecrets", {1: ("name", "string", False)}, True)),
            (4, ("automountServiceAccountToken", "bool", False)),
        ]
    ),
    ("v1", "Service"): dict([_METADATA, (2, ("spec", _SERVICE_SPEC, False))]),
    (_RBAC, "Role"): dict([_METADATA, _RULES]),
    (_RBAC, "ClusterRole"): dict([_METADATA, _RULES]),
    (_RBAC, "RoleBinding"): dict(_BINDING),
    (_RBAC, "ClusterRoleBinding"): dict(_BINDING),
}
"""The kinds kubectl creates with its typed clients, by (apiVersion, kind)."""


def decode(body: bytes) -> Obj:
    """The JSON object a protobuf request body holds; 400 when it is not Kubernetes' envelope,
    415 for a kind this fake does not read."""
    if not body.startswith(MAGIC):
        raise ApiError(400, "BadRequest", "the protobuf body lacks the k8s\\0 prefix")
    try:
        unknown = _message(memoryview(body)[len(MAGIC) :], _UNKNOWN)
        type_meta = unknown.get("typeMeta", {})
        api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
        table = KINDS.get((api_version, kind))
        if table is None:
            readable = ", ".join(sorted(k for _, k in KINDS))
            message = f"the fake API server reads protobuf bodies of {readable} only, "
            raise ApiError(
                415,
                "UnsupportedMediaType",
                message + f"not {kind or 'this object'}: send application/json",
            )
        obj = _message(memoryview(unknown.get("raw", b"")), table)
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "BadRequest", f"the protobuf body cannot be read: {exc}") from None
    return {"apiVersion": api_version, "kind": kind, **obj}


def _message(data: memoryview, table: Message) -> Obj:
    out: Obj = {}
    position = 0
    while position < len(data):
        tag, position = _varint(data, position)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            raw: Any
            raw, position = _varint(data, position)
        elif wire == 2:
            size, position = _varint(data, position)
            raw, position = data[position : position + size], position + size
            if len(raw) != size:
                raise ValueError("a field runs past the end of the body")
        elif wire in (1, 5):
            position += 8 if wire == 1 else 4
            continue  # no fixed-width field in the kinds read
        else:
            raise ValueError(f"unknown wire type {wire}")
        if number not in table:
            continue  # a field the fake does not keep (as selfLink, managedFields)
        name, kind, repeated = table[number]
        if isinstance(kind, str) and kind.startswith("map:"):
            entry = _message(raw, {1: ("key", "string", False), 2: ("value", kind[4:], False)})
            out.setdefault(name, {})[entry.get("key", "")] = entry.get("value", "")
            continue
        value = _value(raw, kind)
        if value is None or (not repeated and value in ("", 0) and not isinstance(value, bool)):
            continue  # Go writes unset strings and numbers as zeros; its JSON omits them
        if repeated:
            out.setdefault(name, []).append(value)
        else:
            out[name] = value
    return out


def _value(raw: Any, kind: Kind) -> Any:
    if not isinstance(kind, str):
        return _message(raw, kind)
    if kind == "string":
        return bytes(raw).decode()
    if kind == "bytes":
        return base64.b64encode(bytes(raw)).decode()
    if kind == "raw":
        return bytes(raw)
    if kind == "int":
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if kind == "bool":
        return bool(raw)
    if kind == "intstr":  # IntOrString: type 0 with intVal, 1 with strVal
        fields = {1: ("type", "int", False), 2: ("int", "int", False), 3: ("str", "string", False)}
        parts = _message(raw, fields)
        return parts.get("str", "") if parts.get("type") == 1 else parts.get("int", 0)
    if kind == "time":
        seconds = _message(raw, {1: ("seconds", "int", False)}).get("seconds", 0)
        if not seconds:
            return None  # Go's zero time: the field is unset
        moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    raise ValueError(f"unknown field kind {kind}")


def _varint(data: memoryview, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise ValueError("a varint is too long")
