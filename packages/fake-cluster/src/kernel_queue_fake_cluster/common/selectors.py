"""Kubernetes label and field selectors, parsed once and matched against plain dicts.

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a` (exists), `!a`.
Field selectors: `path=value`, `path==value`, `path!=value` on dotted paths such as
`metadata.name` or `status.phase`. A bad selector raises ValueError with the offending text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]

_SET = re.compile(r"^\s*(!?)([A-Za-z0-9._/-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_KEY = re.compile(r"^[A-Za-z0-9._/-]+$")


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _equality(term: str) -> tuple[str, str, str] | None:
    for op in ("!=", "==", "="):
        if op in term:
            key, _, value = term.partition(op)
            return key.strip(), op, value.strip()
    return None


@dataclass(frozen=True)
class _Requirement:
    """One term: `key op values` with op in =, !=, in, notin, exists, !exists."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def holds(self, found: Mapping[str, Any], value: str | None) -> bool:
        if self.op == "exists":
            return self.key in found
        if self.op == "!exists":
            return self.key not in found
        if self.op in ("=", "in"):
            return value in self.values
        return value not in self.values  # "!=" and "notin"


def _requirement(term: str, *, field: bool) -> _Requirement:
    found = None if field else _SET.match(term)
    if found:
        if found.group(1):
            raise ValueError(f"invalid label selector term {term!r}")
        values = frozenset(v.strip() for v in found.group(4).split(",") if v.strip())
        return _Requirement(found.group(2), found.group(3), values)
    parsed = _equality(term)
    kind = "field" if field else "label"
    if parsed is not None:
        key, op, value = parsed
        if not key or (not field and not _KEY.match(key)):
            raise ValueError(f"invalid {kind} selector term {term!r}")
        return _Requirement(key, "!=" if op == "!=" else "=", frozenset({value}))
    negate = term.startswith("!")
    key = term[1:].strip() if negate else term
    if field or not _KEY.match(key):
        raise ValueError(f"invalid {kind} selector term {term!r}")
    return _Requirement(key, "!exists" if negate else "exists")


def labels(text: str | None) -> Matcher:
    """A matcher on `obj["metadata"]["labels"]` for a label selector ("" matches everything)."""
    requirements = [_requirement(term, field=False) for term in _split(text or "")]

    def match(obj: Mapping[str, Any]) -> bool:
        found = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.holds(found, found.get(r.key)) for r in requirements)

    return match


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return ""
        value = value.get(part)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def fields(text: str | None) -> Matcher:
    """A matcher for a field selector on dotted paths ("" matches everything)."""
    requirements = [_requirement(term, field=True) for term in _split(text or "")]

    def match(obj: Mapping[str, Any]) -> bool:
        return all(r.holds({}, _field(obj, r.key)) for r in requirements)

    return match


def selector_dict(selector: Mapping[str, Any] | None) -> Matcher:
    """A matcher for a `metav1.LabelSelector` dict (matchLabels + matchExpressions).

    `None` matches nothing and `{}` matches everything, as for a ClusterQueue namespaceSelector.
    """
    if selector is None:
        return lambda obj: False
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expression in selector.get("matchExpressions") or []:
        key, op = expression["key"], expression["operator"]
        values = ",".join(expression.get("values") or [])
        terms.append(
            {
                "In": f"{key} in ({values})",
                "NotIn": f"{key} notin ({values})",
                "Exists": key,
                "DoesNotExist": f"!{key}",
            }[op]
        )
    return labels(",".join(terms))
