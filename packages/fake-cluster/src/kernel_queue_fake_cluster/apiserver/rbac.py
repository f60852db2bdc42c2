"""RBAC rule evaluation for the fake API server: may this user do this verb on this resource?

Pure functions over Role/ClusterRole/RoleBinding/ClusterRoleBinding dicts, indexed once per
policy change; no HTTP, no store access (the server hands the objects in and asks). Not
evaluated: aggregated ClusterRoles (`aggregationRule`) and `nonResourceURLs` rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernel_queue_fake_cluster.apiserver.errors import ApiError

Rule = Mapping[str, Any]

SUPERUSER_GROUP = "system:masters"
"""Members skip authorization, as on a real apiserver."""


@dataclass(frozen=True)
class User:
    """An authenticated user: a name such as `system:serviceaccount:<ns>:<sa>`, and groups."""

    name: str
    groups: tuple[str, ...] = ()

    def subjects(self) -> list[tuple[str, str]]:
        """(kind, name) keys a binding subject must match: the user and all its groups."""
        groups = [*self.groups, "system:authenticated"]
        parts = self.name.split(":")
        if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
            groups += ["system:serviceaccounts", f"system:serviceaccounts:{parts[2]}"]
        return [("User", self.name), *(("Group", group) for group in groups)]


@dataclass(frozen=True)
class Attributes:
    """What a request does, as the apiserver's RequestInfo sees it ("" namespace: cluster)."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def _listed(wanted: str, allowed: Iterable[str]) -> bool:
    return any(item in ("*", wanted) for item in allowed)


def rule_allows(rule: Rule, attrs: Attributes) -> bool:
    """One PolicyRule against one request: verbs, apiGroups, resources, resourceNames."""
    if not _listed(attrs.verb, rule.get("verbs") or ()):
        return False
    if not _listed(attrs.group, rule.get("apiGroups") or ()):
        return False
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    resources = rule.get("resources") or ()
    if not any(
        item in ("*", combined) or (attrs.subresource and item == f"*/{attrs.subresource}")
        for item in resources
    ):
        return False
    names = rule.get("resourceNames") or ()
    return not names or attrs.name in names


class Policy:
    """The RBAC objects of one cluster, indexed by subject for per-request checks."""

    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self._rules: dict[tuple[str, str, str], Sequence[Rule]] = {}
        self._bindings: dict[tuple[str, str], list[tuple[str, tuple[str, str, str]]]] = {}
        for obj in objects:
            kind, meta = obj.get("kind", ""), obj.get("metadata") or {}
            namespace = meta.get("namespace", "") if kind in ("Role", "RoleBinding") else ""
            if kind in ("Role", "ClusterRole"):
                self._rules[(kind, namespace, meta["name"])] = obj.get("rules") or ()
            elif kind in ("RoleBinding", "ClusterRoleBinding"):
                ref = obj["roleRef"]
                role_ns = namespace if ref["kind"] == "Role" else ""
                for subject in obj.get("subjects") or ():
                    key = _subject_key(subject, namespace)
                    entry = (namespace, (ref["kind"], role_ns, ref["name"]))
                    self._bindings.setdefault(key, []).append(entry)

    def allows(self, user: User, attrs: Attributes) -> bool:
        """True when a binding of the user (or a group of it) grants a rule matching `attrs`.
        RoleBindings grant only inside their namespace; ClusterRoleBindings everywhere."""
        if SUPERUSER_GROUP in user.groups:
            return True
        for key in user.subjects():
            for binding_ns, role in self._bindings.get(key, ()):
                if binding_ns and binding_ns != attrs.namespace:
                    continue
                if any(rule_allows(rule, attrs) for rule in self._rules.get(role, ())):
                    return True
        return False


def _subject_key(subject: Mapping[str, Any], binding_namespace: str) -> tuple[str, str]:
    if subject.get("kind") == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return ("User", f"system:serviceaccount:{namespace}:{subject['name']}")
    return (subject.get("kind", "User"), subject["name"])


def forbidden(user: User, attrs: Attributes) -> ApiError:
    """403 with the apiserver's wording, e.g. `pods is forbidden: User "u" cannot create
    resource "pods" in API group "" in the namespace "ns"`."""
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    reason = (
        f'User "{user.name}" cannot {attrs.verb} resource "{combined}" '
        f'in API group "{attrs.group}" {scope}'
    )
    what = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    target = f'{what} "{attrs.name}"' if attrs.name else what
    details = {"group": attrs.group, "kind": attrs.resource}
    if attrs.name:
        details["name"] = attrs.name
    return ApiError(403, "Forbidden", f"{target} is forbidden: {reason}", details)


def unauthorized() -> ApiError:
    """401 for a missing or unknown bearer token."""
    return ApiError(401, "Unauthorized", "Unauthorized")
