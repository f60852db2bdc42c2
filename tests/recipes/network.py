"""What a set of NetworkPolicies lets through, by the rules of networking.k8s.io/v1, so a test
can ask of a recipe's policy the questions an admin would: may this pod open this port of that
pod? The fake cluster enforces no NetworkPolicy (its pods share the host's network), so the
recipes' policies are read here against the labels of pods the backend really made. Covered:
podSelector and namespaceSelector (matchLabels, matchExpressions), ports with endPort, and
policyTypes; ipBlock peers are not (the recipes use none for ingress)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Pod:
    """A pod as a policy sees it: its namespace (and that namespace's labels) and labels."""

    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, pod: Obj) -> Pod:
        meta = pod["metadata"]
        namespace = meta.get("namespace", "default")
        return cls(
            namespace, dict(meta.get("labels") or {}), {"kubernetes.io/metadata.name": namespace}
        )


def selects(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector against labels; an empty selector selects everything."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or ()
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def _peer(peer: Obj, pod: Pod, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], pod.namespace_labels):
            return False
    elif pod.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector"), pod.labels)


def _peers(peers: Iterable[Obj] | None, pod: Pod, policy_namespace: str) -> bool:
    """A rule without peers admits every pod; else one peer must match."""
    listed = list(peers or ())
    return not listed or any(_peer(peer, pod, policy_namespace) for peer in listed)


def _port(ports: Iterable[Obj] | None, port: int, protocol: str) -> bool:
    listed = list(ports or ())
    if not listed:
        return True
    for entry in listed:
        if entry.get("protocol", "TCP") != protocol:
            continue
        first = entry.get("port")
        if first is None:
            return True
        last = entry.get("endPort", first)
        if isinstance(first, int) and first <= port <= last:
            return True
    return False


def _types(policy: Obj) -> list[str]:
    spec = policy["spec"]
    return list(
        spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])
    )


def ingress_allowed(
    policies: Iterable[Obj], source: Pod, target: Pod, port: int, protocol: str = "TCP"
) -> bool:
    """May `source` open `port` on `target`, as far as `target`'s ingress policies say?"""
    isolating = [
        p
        for p in policies
        if p["metadata"].get("namespace") == target.namespace
        and "Ingress" in _types(p)
        and selects(p["spec"].get("podSelector"), target.labels)
    ]
    if not isolating:
        return True
    return any(
        _peers(rule.get("from"), source, p["metadata"]["namespace"])
        and _port(rule.get("ports"), port, protocol)
        for p in isolating
        for rule in p["spec"].get("ingress") or ()
    )


def egress_allowed(
    rules: Iterable[Obj], source_namespace: str, target: Pod, port: int, protocol: str = "TCP"
) -> bool:
    """May a pod whose egress `rules` (a policy's `spec.egress`) are these, in
    `source_namespace`, open `port` on `target`?"""
    return any(
        _peers(rule.get("to"), target, source_namespace)
        and _port(rule.get("ports"), port, protocol)
        for rule in rules
    )
