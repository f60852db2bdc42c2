"""Names Kubernetes accepts: DNS-1123 labels, label values, and our object names.

Sanitizers never raise: they replace what is invalid, trim, and append ``-`` plus eight hex digits
of the original's sha256 whenever they had to change or shorten the text, so distinct inputs stay
distinct. Everything here is pure and deterministic; nothing reads a cluster.
"""

from __future__ import annotations

import hashlib
import re

from kernel_queue import model
from kernel_queue.kube import kueue

LABEL_MAX = 63
"""Longest DNS-1123 label and longest label value."""
SUBDOMAIN_MAX = 253
"""Longest DNS-1123 subdomain (most object names)."""
HASH_LENGTH = 8

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_NOT_DNS_LABEL = re.compile(r"[^-a-z0-9]")
_NOT_LABEL_VALUE = re.compile(r"[^-A-Za-z0-9_.]")


def is_dns_label(text: str) -> bool:
    """True for a DNS-1123 label: at most 63 of ``[a-z0-9-]``, alphanumeric at both ends."""
    return len(text) <= LABEL_MAX and _DNS_LABEL.fullmatch(text) is not None


def is_dns_subdomain(text: str) -> bool:
    """True for a DNS-1123 subdomain: at most 253 characters, dot-separated DNS-1123 labels.
    ServiceAccounts, PersistentVolumeClaims and most other objects are named so."""
    return len(text) <= SUBDOMAIN_MAX and _DNS_SUBDOMAIN.fullmatch(text) is not None


def is_queue_name(text: str) -> bool:
    """True for a name that is both an object name (DNS-1123 subdomain) and a label value, as a
    LocalQueue's or WorkloadPriorityClass's must be: pods carry it in a Kueue label."""
    return is_dns_subdomain(text) and is_label_value(text)


def is_extended_resource(text: str) -> bool:
    """True for an extended resource name such as ``nvidia.com/gpu``: a DNS subdomain outside
    ``kubernetes.io``, a slash, and a name part of at most 63 characters."""
    domain, slash, name = text.partition("/")
    return (
        bool(slash)
        and is_dns_subdomain(domain)
        and not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))
        and len(name) <= LABEL_MAX
        and _QUALIFIED_NAME.fullmatch(name) is not None
    )


def is_label_value(text: str) -> bool:
    """True for a label value: empty, or at most 63 of ``[-A-Za-z0-9_.]``, alphanumeric ends."""
    return len(text) <= LABEL_MAX and _LABEL_VALUE.fullmatch(text) is not None


def short_hash(text: str) -> str:
    """Eight hex digits of the sha256 of ``text`` (UTF-8), the suffix that keeps names distinct."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_LENGTH]


def label_value(text: str) -> str:
    """``text`` as a valid label value; unchanged when it already is one (``""`` included)."""
    if is_label_value(text):
        return text
    return _sanitize(text, _NOT_LABEL_VALUE.sub("-", text), "-_.", LABEL_MAX)


def dns_label(text: str) -> str:
    """``text`` as a DNS-1123 label (lower case); unchanged when it already is one."""
    if is_dns_label(text):
        return text
    return _sanitize(text, _NOT_DNS_LABEL.sub("-", text.lower()), "-", LABEL_MAX)


def _sanitize(original: str, cleaned: str, edges: str, limit: int) -> str:
    """``cleaned`` trimmed to ``limit`` with room for ``-<hash of original>``, ends stripped."""
    suffix = short_hash(original)
    body = cleaned.strip(edges)[: limit - HASH_LENGTH - 1].rstrip(edges)
    return f"{body}-{suffix}" if body else suffix


def group_name(kernel_id: str, launch: int) -> str:
    """The pod group (and Workload) name of one launch: ``model.group_name`` (``kq-`` and the
    whole id's 32 hex digits, so two kernels never share a name), then ``…-<launch>``.

    Each launch gets a new name so a finished Workload of an earlier launch, which Kueue will
    not adopt (Kueue's ``FindMatchingWorkloads``: pods stay gated with ``WorkloadNameConflict``),
    never collides with the new group. Launch 0 matches
    ``model.group_name``.
    """
    if launch < 0:
        raise ValueError(f"launch must be 0 or more, not {launch}")
    base = model.group_name(kernel_id)
    return base if launch == 0 else f"{base}-{launch}"


def pod_name(group: str, role: str, index: int, attempt: int) -> str:
    """One pod of ``group``: ``<group>-head-<attempt>`` or ``<group>-w<index>-<attempt>``.

    ``attempt`` counts replacement rounds within the group, so replacement pods never collide
    with pods of the previous round that are still terminating.
    """
    if role == kueue.ROLE_HEAD and index == 0:
        member = "head"
    elif role == kueue.ROLE_WORKER and index > 0:
        member = f"w{index}"
    else:
        raise ValueError(f"no {role!r} pod has index {index}: the head is 0, workers 1 and up")
    if attempt < 0:
        raise ValueError(f"attempt must be 0 or more, not {attempt}")
    return dns_label(f"{group}-{member}-{attempt}")


def pod_attempt(name: str) -> int:
    """The replacement round ``pod_name`` put in a pod's name; -1 for a name not of that form."""
    _, _, attempt = name.rpartition("-")
    return int(attempt) if attempt.isdigit() else -1


def member_hostname(index: int) -> str:
    """The host name of the group's pod of rank `index` in its headless Service: ``head`` for
    0, ``w<index>`` for a worker (as in its pod's name), the same in every replacement round."""
    if index < 0:
        raise ValueError(f"no pod has rank {index}: the head is 0, workers 1 and up")
    return "head" if index == 0 else f"w{index}"


def group_service_name(kernel_id: str) -> str:
    """The headless Service of a multi-pod kernel's pods, ``kq-<32 hex>-group``: the subdomain
    under which each pod has its stable DNS name; the same for every launch."""
    return f"{model.group_name(kernel_id)}-group"


def service_name(kernel_id: str) -> str:
    """The kernel's ClusterIP Service, ``kq-<32 hex>`` (a DNS-1035 label): the same for every
    launch."""
    return model.group_name(kernel_id)


def secret_name(kernel_id: str) -> str:
    """The Secret holding the kernel's connection key, ``kq-<32 hex>-key``."""
    return f"{model.group_name(kernel_id)}-key"
