"""The fake Kueue's pod webhooks: `mpod.kb.io` defaulting and `vpod.kb.io` validation.

After `Default`, `ValidateCreate` and `ValidateUpdate` in Kueue's
`pkg/controller/jobs/pod/pod_webhook.go`: the managed-namespace filter, the LocalQueue named
`default`, the WorkloadPriorityClass named `default` (from 0.20, `ApplyDefaultWorkloadPriorityClass`
in `pkg/controller/jobframework/defaults.go`), the managed label, the finalizer, the scheduling
gates and the role hash;
bad group metadata and forbidden changes are refused with 403 Forbidden, as the apiserver relays
a webhook's denial ("admission webhook "vpod.kb.io" denied the request: <field errors>").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kernel_queue_fake_cluster.apiserver import schema
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.store import Store
from kernel_queue_fake_cluster.kueue import constants as k
from kernel_queue_fake_cluster.kueue import pods

Obj = dict[str, Any]
FieldError = str  # "<path>: <Kind>: <detail>", as Go's field.Error prints


def default_namespace_selector(kueue_namespace: str) -> Obj:
    """`managedJobsNamespaceSelector`'s default: every namespace but kube-system and Kueue's."""
    values = ["kube-system", kueue_namespace]
    return {
        "matchExpressions": [{"key": k.NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": values}]
    }


def selector_matches(selector: Obj | None, found: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: None matches nothing, {} matches everything."""
    if selector is None:
        return False
    if any(found.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for term in selector.get("matchExpressions") or []:
        key, op, values = term["key"], term["operator"], term.get("values") or []
        if not {
            "In": key in found and found[key] in values,
            "NotIn": key not in found or found[key] not in values,
            "Exists": key in found,
            "DoesNotExist": key not in found,
        }[op]:
            return False
    return True


class PodWebhook:
    """`hook(operation, new, old)` for `Store.add_admission("", "pods", ...)`."""

    def __init__(
        self,
        store: Store,
        kueue_namespace: str,
        managed_namespaces: Obj | None,
        topology: bool,
        *,
        priority_class_defaulting: bool = False,
    ) -> None:
        self.store, self.kueue_namespace = store, kueue_namespace
        self.managed_namespaces, self.topology = managed_namespaces, topology
        self.priority_class_defaulting = priority_class_defaulting

    def __call__(self, operation: str, new: Obj | None, old: Obj | None) -> Obj | None:
        if new is None or new["metadata"].get("namespace") in ("kube-system", self.kueue_namespace):
            return None  # DELETE, or outside the webhooks' own namespaceSelector
        if operation == "CREATE":
            self.default(new)
        errors = validate(new)
        if old is not None:
            errors += self.validate_update(new, old)
        if errors:
            text = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
            message = f'admission webhook "{k.VALIDATING_WEBHOOK}" denied the request: {text}'
            raise ApiError(403, "Forbidden", message)
        return new

    def default(self, pod: Obj) -> None:
        """Kueue's `Default`, in place: a pod of an unmanaged namespace is left alone; with no
        queue name, a LocalQueue named `default` in its namespace gives it that one; with
        `priority_class_defaulting` and no priority-class label, a WorkloadPriorityClass named
        `default` gives it that one (queue or not, as Kueue does); a pod with a queue name gets
        the managed label and finalizer, the gates and the role hash."""
        meta = pod["metadata"]
        namespace = self.store.get("", "namespaces", None, meta["namespace"])
        found = {k.NAMESPACE_NAME_LABEL: meta["namespace"], **pods.labels_of(namespace)}
        if not selector_matches(self.managed_namespaces, found):
            return
        labels = meta.setdefault("labels", {})
        if not labels.get(k.QUEUE_LABEL) and self._default_queue_exists(meta["namespace"]):
            labels[k.QUEUE_LABEL] = k.DEFAULT_LOCAL_QUEUE_NAME
        if (
            self.priority_class_defaulting
            and not labels.get(k.WORKLOAD_PRIORITY_CLASS_LABEL)
            and self._exists("workloadpriorityclasses", None, k.DEFAULT_PRIORITY_CLASS_NAME)
        ):
            labels[k.WORKLOAD_PRIORITY_CLASS_LABEL] = k.DEFAULT_PRIORITY_CLASS_NAME
        if not labels.get(k.QUEUE_LABEL):
            return
        labels[k.MANAGED_LABEL] = k.MANAGED_LABEL_VALUE
        finalizers = meta.setdefault("finalizers", [])
        if k.POD_FINALIZER not in finalizers:
            finalizers.append(k.POD_FINALIZER)
        spec_gates = pod.setdefault("spec", {}).setdefault("schedulingGates", [])
        for gate in (k.ADMISSION_GATE, k.TOPOLOGY_GATE) if self.topology else (k.ADMISSION_GATE,):
            if gate not in pods.gates(pod):
                spec_gates.append({"name": gate})
        annotations = meta.setdefault("annotations", {})
        if self.topology and k.POD_INDEX_LABEL_ANNOTATION in annotations:
            labels[k.POD_INDEX_LABEL] = labels.get(annotations[k.POD_INDEX_LABEL_ANNOTATION], "")
        annotations[k.ROLE_HASH_ANNOTATION] = pods.role_hash(pod)

    def _default_queue_exists(self, namespace: str) -> bool:
        return self._exists("localqueues", namespace, k.DEFAULT_LOCAL_QUEUE_NAME)

    def _exists(self, plural: str, namespace: str | None, name: str) -> bool:
        try:
            self.store.get(k.KUEUE_GROUP, plural, namespace, name)
        except ApiError:
            return False
        return True

    def validate_update(self, new: Obj, old: Obj) -> list[FieldError]:
        """`ValidateUpdate`'s extra rules: one-way retriable-in-group, immutable group and queue."""
        errors = []
        group = pods.group_name(new)
        old_false = pods.annotations_of(old).get(k.RETRIABLE_IN_GROUP_ANNOTATION) == "false"
        new_false = pods.annotations_of(new).get(k.RETRIABLE_IN_GROUP_ANNOTATION) == "false"
        if group and old_false and not new_false:
            path = _annotation_path(k.RETRIABLE_IN_GROUP_ANNOTATION)
            errors.append(
                f"{path}: Forbidden: unretriable pod group can't be converted to retriable"
            )
        old_group = pods.group_name(old)
        if old_group and group != old_group:
            errors.append(_immutable(_group_path(new), group))
        queue, old_queue = (
            pods.labels_of(new).get(k.QUEUE_LABEL, ""),
            pods.labels_of(old).get(k.QUEUE_LABEL, ""),
        )
        if not pods.is_suspended(new) and queue != old_queue:
            errors.append(_immutable(_label_path(k.QUEUE_LABEL), queue))
        if not queue and old_queue and self._default_queue_exists(new["metadata"]["namespace"]):
            errors.append(
                f'{_label_path(k.QUEUE_LABEL)}: Invalid value: "": '
                "queue-name must not be empty in namespace with default queue"
            )
        return errors


def validate(pod: Obj) -> list[FieldError]:
    """`validateCommon`: the managed label's value, group metadata, prebuilt name."""
    errors = []
    managed = pods.labels_of(pod).get(k.MANAGED_LABEL)
    if managed is not None and managed != k.MANAGED_LABEL_VALUE:
        path = _label_path(k.MANAGED_LABEL)
        errors.append(
            f"{path}: Forbidden: managed label value can only be '{k.MANAGED_LABEL_VALUE}'"
        )
    errors += _validate_group(pod)
    group, prebuilt = pods.group_name(pod), pods.labels_of(pod).get(k.PREBUILT_WORKLOAD_LABEL, "")
    if group and prebuilt and prebuilt != group:
        path = _label_path(k.PREBUILT_WORKLOAD_LABEL)
        errors.append(
            f'{path}: Invalid value: "{prebuilt}": prebuilt workload and pod group should be equal'
        )
    return errors


def _validate_group(pod: Obj) -> list[FieldError]:
    """`validatePodGroupMetadata`: name and total count come together; count is an int >= 1."""
    annotations = pods.annotations_of(pod)
    by_annotation = bool(annotations.get(k.GROUP_NAME_ANNOTATION))
    detail = (
        f"both the '{k.GROUP_TOTAL_COUNT_ANNOTATION}' annotation and the "
        f"'{k.GROUP_NAME_ANNOTATION}' {'annotation' if by_annotation else 'label'} should be set"
    )
    has_count = k.GROUP_TOTAL_COUNT_ANNOTATION in annotations
    group = pods.group_name(pod)
    errors = []
    if not group:
        if has_count:
            return [f"{_group_path(pod)}: Required value: {detail}"]
    else:
        if len(group) > 253 or not re.fullmatch(schema.DNS_SUBDOMAIN, group):
            why = (
                "must be no more than 253 characters"
                if len(group) > 253
                else schema.DNS_SUBDOMAIN_MESSAGE
            )
            errors.append(f'{_group_path(pod)}: Invalid value: "{group}": {why}')
        if not has_count:
            return [
                *errors,
                f"{_annotation_path(k.GROUP_TOTAL_COUNT_ANNOTATION)}: Required value: {detail}",
            ]
    if has_count:
        try:
            pods.total_count(pod)
        except ValueError as exc:
            value = annotations[k.GROUP_TOTAL_COUNT_ANNOTATION]
            path = _annotation_path(k.GROUP_TOTAL_COUNT_ANNOTATION)
            errors.append(f'{path}: Invalid value: "{value}": {exc}')
    return errors


def _label_path(key: str) -> str:
    return f"metadata.labels[{key}]"


def _annotation_path(key: str) -> str:
    return f"metadata.annotations[{key}]"


def _group_path(pod: Obj) -> str:
    if pods.annotations_of(pod).get(k.GROUP_NAME_ANNOTATION):
        return _annotation_path(k.GROUP_NAME_ANNOTATION)
    return _label_path(k.GROUP_NAME_LABEL)


def _immutable(path: str, value: str) -> FieldError:
    return f'{path}: Invalid value: "{value}": field is immutable'
