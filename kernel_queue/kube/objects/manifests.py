"""Pure builders of one kernel's objects: the Secret with its key, its Service, its group's pods.

``GroupSpec`` in, plain dicts out: no I/O, and the same input always gives the same output, so
replacement pods keep Kueue's role hash (the hash of a pod's shape that matches it to a pod set of
its Workload: Kueue, ``getRoleHash`` in pkg/controller/jobs/pod/pod_controller.go). Every key
comes from ``kueue``; the admin's ``pod_template`` is merged under the fields we own
(``templates``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kernel_queue import errors, ids
from kernel_queue.kube import kueue, names
from kernel_queue.kube.objects import launcher_archive, templates
from kernel_queue.launcher import contract, group
from kernel_queue.model import GroupSpec

KERNEL_PORTS = {"shell": 50100, "iopub": 50101, "stdin": 50102, "control": 50103, "hb": 50104}
"""Fixed in-pod kernel ports (each pod has its own IP); the Service exposes the same numbers."""
KEY_FIELD = "key"
"""The Secret's data field holding the connection key."""
KERNEL_CONTAINER, WORKER_CONTAINER = "kernel", "worker"
LAUNCHER_COMMAND = ("python", "-m", "kernel_queue.launcher")
"""The command of an image with kernel-queue installed; the backend delivers its own instead."""
WORKER_COMMAND = (*LAUNCHER_COMMAND, "--worker")
"""The command of worker pods: the launcher's worker mode, which runs the kernelspec's
``worker_command`` (its arguments after ``--``) and waits for SIGTERM."""
CHECKPOINT_VOLUME, CHECKPOINT_MOUNT = "checkpoints", "/checkpoints"
ENV_POD_IP = "POD_IP"
# A TCP connect to the shell port is answered by ZMQ's I/O thread, so a kernel busy in a long
# cell stays Ready (a pod that stops being Ready starts waitForPodsReady's recovery timeout, after
# which Kueue evicts the group: Kueue, pkg/controller/core/workload_controller.go).
READINESS_PROBE = {"tcpSocket": {"port": "shell"}, "periodSeconds": 1, "failureThreshold": 3}
POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
}


def common_labels(spec: GroupSpec, owner: str = "") -> dict[str, str]:
    """Our labels on every object of the kernel: kernel id, user, managed-by, component, and
    the owning server's id when one is given."""
    found = {
        kueue.KERNEL_ID_LABEL: names.label_value(spec.kernel_id),
        kueue.MANAGED_BY_LABEL: kueue.MANAGED_BY,
        kueue.COMPONENT_LABEL: kueue.COMPONENT,
    }
    if spec.user:
        found[kueue.USER_LABEL] = names.label_value(spec.user)
    if owner:
        found[kueue.OWNER_LABEL] = names.label_value(owner)
    return found


def common_annotations(spec: GroupSpec) -> dict[str, str]:
    """Our annotations on every object of the kernel: the raw user name and the kernelspec."""
    found = {}
    if spec.user:
        found[kueue.USER_ANNOTATION] = spec.user
    if spec.kernelspec:
        found[kueue.KERNELSPEC_ANNOTATION] = spec.kernelspec
    return found


def member_addresses(spec: GroupSpec) -> list[str]:
    """Each pod's stable DNS name in rank order, ``<hostname>.<group Service>.<namespace>.svc``
    (without a namespace, ``<hostname>.<group Service>``, which resolves in the pod's own)."""
    subdomain = names.group_service_name(spec.kernel_id)
    where = f".{spec.namespace}.svc" if spec.namespace else ""
    return [
        f"{names.member_hostname(index)}.{subdomain}{where}" for index in range(spec.pod_group_size)
    ]


def checkpoint_subpath(spec: GroupSpec) -> str:
    """The kernel's directory in the checkpoint claim (``ids.directory``): its checked id, one
    path segment; ``ConfigError`` otherwise, before anything is created."""
    return ids.directory(spec.kernel_id)


def grace_seconds(spec: GroupSpec) -> int:
    """``terminationGracePeriodSeconds``: the whole seconds of the pod's ``contract.budget``."""
    return int(contract.budget(spec.grace_seconds, pod=True).grace)


def secret(spec: GroupSpec, *, owner: str = "") -> dict[str, Any]:
    """The Opaque Secret holding the connection key; the key appears in no other object."""
    labels = common_labels(spec, owner)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, names.secret_name(spec.kernel_id), labels),
        "type": "Opaque",
        "stringData": {KEY_FIELD: spec.connection.key},
    }


def service(spec: GroupSpec, *, owner: str = "") -> dict[str, Any]:
    """The ClusterIP Service selecting the head pod: the kernel's address across pod replacement.
    It publishes the head before the pod is Ready: the server connects once it reached the
    kernel itself, not a kubelet's readiness period later (at most one head pod runs at a time:
    a replacement is made once its predecessor stopped)."""
    labels = common_labels(spec, owner)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, names.service_name(spec.kernel_id), labels),
        "spec": {
            "type": "ClusterIP",
            "selector": {
                kueue.KERNEL_ID_LABEL: names.label_value(spec.kernel_id),
                kueue.ROLE_LABEL: kueue.ROLE_HEAD,
            },
            "ports": [
                {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                for name, port in KERNEL_PORTS.items()
            ],
            "publishNotReadyAddresses": True,
        },
    }


def group_service(spec: GroupSpec, *, owner: str = "") -> dict[str, Any]:
    """The headless Service of a multi-pod kernel's pods (all of them: head and workers), which
    gives each pod its stable DNS name (``member_addresses``) through its ``hostname`` and
    ``subdomain``. It publishes pods before they are ready: a worker may look for the head while
    its kernel starts. No ports: the names reach every port (the kernel's own Service stays the
    server's way in)."""
    labels = common_labels(spec, owner)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, names.group_service_name(spec.kernel_id), labels),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "None",
            "selector": {kueue.KERNEL_ID_LABEL: names.label_value(spec.kernel_id)},
            "publishNotReadyAddresses": True,
        },
    }


def pods(
    spec: GroupSpec,
    group: str,
    attempt: int,
    *,
    kernel_env: Mapping[str, str] | None = None,
    checkpoint_claim: str | None = None,
    owner: str = "",
    launcher: str | None = None,
) -> list[dict[str, Any]]:
    """The ``spec.pod_group_size`` pods of ``group``'s replacement round ``attempt``; head first.

    ``kernel_env`` is the kernel's own environment, and the only one read: both callers pass
    ``spec.env``, which ``spec.with_env`` cut to the kernelspec's ``env`` stanza (never the
    server's environment). Its ``$`` are escaped, so Kubernetes passes values literally, as the
    local backend does; names we set, and every ``KERNEL_QUEUE_LAUNCH_*``, are dropped from it.
    Worker pods run the launcher's worker mode, and under it the kernelspec's
    ``worker_command`` (``spec.worker_command``) where one is given: its words are not escaped,
    so Kubernetes expands ``$(MASTER_ADDR)`` and the other variables of the container in them.
    ``checkpoint_claim`` mounts the kernel's own directory of that PVC (``subPath``: the kernel
    id) at ``/checkpoints`` in the head pod. ``owner`` labels every pod with the server's id.
    ``launcher`` names the ConfigMap holding the launcher archive: each container of ours then
    runs it (``launcher_archive.COMMAND``) from that ConfigMap, mounted read-only; without it,
    ``python -m kernel_queue.launcher`` of the image.
    """
    env = dict(kernel_env or {})
    found = [
        _pod(spec, group, attempt, index, env, checkpoint_claim, owner)
        for index in range(spec.pod_group_size)
    ]
    if launcher:
        return [launcher_archive.mounted(pod, launcher, LAUNCHER_COMMAND) for pod in found]
    return found


def _metadata(
    spec: GroupSpec,
    name: str,
    our_labels: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if spec.namespace:
        metadata["namespace"] = spec.namespace
    metadata["labels"] = dict(our_labels)
    found = {**common_annotations(spec), **(extra or {})}
    if found:
        metadata["annotations"] = found
    return metadata


def _pod(
    spec: GroupSpec,
    group: str,
    attempt: int,
    index: int,
    kernel_env: dict[str, str],
    checkpoint_claim: str | None,
    owner: str,
) -> dict[str, Any]:
    role = kueue.ROLE_HEAD if index == 0 else kueue.ROLE_WORKER
    template = copy.deepcopy(dict(spec.pod_template))
    template_meta = templates.mapping(template.get("metadata"))
    pod_spec = templates.mapping(template.get("spec"))

    pod_labels = {
        **common_labels(spec, owner),
        kueue.ROLE_LABEL: role,
        kueue.QUEUE_NAME_LABEL: spec.queue,
        kueue.POD_GROUP_NAME_LABEL: group,
    }
    # The priority class is written on every pod whenever the kernelspec names one (`default`
    # included), over any label of the template: Kueue 0.20 labels a pod without it (or with an
    # empty one) `default` where a WorkloadPriorityClass of that name exists (Kueue #13719,
    # `ApplyDefaultWorkloadPriorityClass`), and that must never decide a class we were given.
    # When the kernelspec names none we write none: no label value means "no class" to Kueue
    # (its webhook defaults a missing and an empty label alike), so Kueue decides at the first
    # pods' creation, as for any workload in the namespace (0.20: `default` where it exists;
    # before: the pods' PriorityClass, or 0). What it decided is then written explicitly on the
    # group's later pods (`submission.pinned`), so a `default` class deleted while the kernel
    # waits never drops its class from the replacement pods, and Kueue, whose Workload follows
    # its pods' label (`UpdateWorkloadPriority`), never re-prioritises it from them. (A
    # `default` created meanwhile still reaches the replacements of a group whose first pods
    # had no class, as it reaches any new pod: no label can say "none".)
    if spec.priority_class:
        pod_labels[kueue.PRIORITY_CLASS_LABEL] = spec.priority_class
    metadata = _metadata(
        spec,
        names.pod_name(group, role, index, attempt),
        {**templates.mapping(template_meta.get("labels")), **pod_labels},
        {kueue.POD_GROUP_TOTAL_COUNT_ANNOTATION: str(spec.pod_group_size)},
    )
    # Never `retriable-in-group: "false"` at creation: a preemption would end the group.
    template_annotations = {
        key: value
        for key, value in templates.mapping(template_meta.get("annotations")).items()
        if key != kueue.RETRIABLE_IN_GROUP_ANNOTATION
    }
    metadata["annotations"] = {**template_annotations, **metadata.get("annotations", {})}

    mine = KERNEL_CONTAINER if role == kueue.ROLE_HEAD else WORKER_CONTAINER
    containers = [
        c for c in templates.dicts(pod_spec.get("containers")) if isinstance(c.get("name"), str)
    ]
    by_name = {c["name"]: c for c in containers}
    # Workers run the kernel's image unless the template gives its `worker` container another.
    image = (
        spec.image
        or by_name.get(mine, {}).get("image")
        or by_name.get(KERNEL_CONTAINER, {}).get("image")
    )
    if not image:
        raise errors.ConfigError(
            f"kernelspec {spec.kernelspec or '?'!r}: no image for the {mine!r} container of kernel "
            f"{spec.kernel_id}; set `image` in the kernelspec's config or in `pod_template`"
        )
    if role == kueue.ROLE_HEAD:
        ours = _head_container(spec, image, kernel_env, checkpoint_claim)
    else:
        ours = _worker_container(spec, image, index, kernel_env)
    if spec.pod_group_size > 1:  # its stable name in the group's headless Service
        pod_spec["hostname"] = names.member_hostname(index)
        pod_spec["subdomain"] = names.group_service_name(spec.kernel_id)
    allowed = spec.allowed_exceptions
    sidecars = [
        templates.hardened(c, CONTAINER_SECURITY, allowed)
        for c in containers
        if c["name"] not in (KERNEL_CONTAINER, WORKER_CONTAINER)
    ]
    kernel = templates.merge_container(ours, by_name.get(mine, {}), allowed)
    pod_spec["containers"] = [kernel, *sidecars]
    if "initContainers" in pod_spec:
        pod_spec["initContainers"] = [
            templates.hardened(c, CONTAINER_SECURITY, allowed)
            for c in templates.dicts(pod_spec["initContainers"])
        ]

    pod_spec["restartPolicy"] = "Never"
    pod_spec["terminationGracePeriodSeconds"] = grace_seconds(spec)
    pod_spec["enableServiceLinks"] = False
    # No API token for user code unless the template asks for one explicitly.
    pod_spec.setdefault("automountServiceAccountToken", False)
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    theirs = templates.mapping(pod_spec.get("securityContext"))
    pod_spec["securityContext"] = {**theirs, **POD_SECURITY}
    for rule in ("runAsNonRoot", "seccompProfile"):  # where the admin allows the template's
        if rule in allowed and rule in theirs:
            pod_spec["securityContext"][rule] = theirs[rule]
    if role == kueue.ROLE_HEAD and checkpoint_claim:
        volume = {
            "name": CHECKPOINT_VOLUME,
            "persistentVolumeClaim": {"claimName": checkpoint_claim},
        }
        pod_spec["volumes"] = templates.merge_named(
            [volume], templates.dicts(pod_spec.get("volumes")), ("name",)
        )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _head_container(
    spec: GroupSpec, image: str, kernel_env: Mapping[str, str], checkpoint_claim: str | None
) -> dict[str, Any]:
    pod_ip = {"valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    launch = contract.Launch(
        grace_seconds=spec.grace_seconds,
        pod=True,
        ports=tuple(KERNEL_PORTS.values()),
        checkpoint_dir=CHECKPOINT_MOUNT if checkpoint_claim else None,
        keep_checkpoints=spec.checkpoint.keep,
        continuous_checkpoints=spec.checkpoint.continuous,
        # Where the launcher leaves what a preemption saved; the pod status shows it (the
        # backend tells the user). It is the container's terminationMessagePath.
        termination_log=contract.DEFAULT_TERMINATION_LOG,
    )
    env: list[dict[str, Any]] = [
        {"name": contract.ENV_IP, **pod_ip},
        {"name": ENV_POD_IP, **copy.deepcopy(pod_ip)},
        {
            "name": contract.ENV_KEY,
            "valueFrom": {
                "secretKeyRef": {"name": names.secret_name(spec.kernel_id), "key": KEY_FIELD}
            },
        },
        *({"name": name, "value": value} for name, value in contract.render(launch).items()),
        {"name": "KERNEL_ID", "value": spec.kernel_id},
        {"name": "KERNEL_USERNAME", "value": spec.user},
        *_group_env(spec, 0, kernel_env),
    ]
    mounts = []
    if checkpoint_claim:
        # Only the kernel's own directory of the claim (the kubelet makes it if missing): a
        # kernel can neither list nor plant another kernel's checkpoints.
        subpath = checkpoint_subpath(spec)
        mounts.append(
            {"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT, "subPath": subpath}
        )
    container: dict[str, Any] = {
        "name": KERNEL_CONTAINER,
        "image": image,
        "command": list(LAUNCHER_COMMAND),
        "args": ["--", *(_literal(arg) for arg in spec.argv)],
        "env": _with_kernel_env(env, kernel_env),
        "ports": [
            {"name": name, "containerPort": port, "protocol": "TCP"}
            for name, port in KERNEL_PORTS.items()
        ],
        "readinessProbe": copy.deepcopy(READINESS_PROBE),
    }
    if mounts:
        container["volumeMounts"] = mounts
    return _with_common(container, spec)


def _worker_container(
    spec: GroupSpec, image: str, index: int, kernel_env: Mapping[str, str]
) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        *_group_env(spec, index, kernel_env),
        {"name": "KERNEL_ID", "value": spec.kernel_id},
        # The pod's own address, for a worker command's listener (`--host $(POD_IP)`).
        {"name": ENV_POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": image,
        "command": list(WORKER_COMMAND),
    }
    if spec.worker_command:  # not `_literal`: $(VAR) is Kubernetes' to expand, `$$` a `$`
        container["args"] = ["--", *spec.worker_command]
        # The command's SIGKILL comes before the kubelet's, so the worker still exits 143.
        stop = contract.budget(spec.grace_seconds, pod=True).stop_timeout
        env.append({"name": contract.ENV_STOP_TIMEOUT, "value": f"{stop:g}"})
    container["env"] = _with_kernel_env(env, kernel_env)
    return _with_common(container, spec)


def _group_env(spec: GroupSpec, rank: int, kernel_env: Mapping[str, str]) -> list[dict[str, str]]:
    """The group's variables (``group.environment``) of the pod of `rank`; none for one pod."""
    if spec.pod_group_size <= 1:
        return []
    found = group.environment(rank, member_addresses(spec), kernel_env)
    return [{"name": name, "value": _literal(value)} for name, value in found.items()]


def _with_common(container: dict[str, Any], spec: GroupSpec) -> dict[str, Any]:
    """Add the resources and the container securityContext every container of ours gets."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if spec.cpu:
        requests["cpu"] = spec.cpu
    if spec.memory:
        requests["memory"] = spec.memory
    if spec.gpus > 0:
        # Extended resources cannot be overcommitted: the limit must equal the request.
        requests[spec.gpu_resource] = limits[spec.gpu_resource] = str(spec.gpus)
    resources = {
        name: value for name, value in (("requests", requests), ("limits", limits)) if value
    }
    if resources:
        container["resources"] = resources
    container["securityContext"] = copy.deepcopy(CONTAINER_SECURITY)
    return container


def _with_kernel_env(
    ours: list[dict[str, Any]], kernel_env: Mapping[str, str]
) -> list[dict[str, Any]]:
    taken = {item["name"] for item in ours}
    return ours + [
        {"name": name, "value": _literal(value)}
        for name, value in contract.kernel_env(kernel_env).items()
        if name not in taken
    ]


def _literal(text: str) -> str:
    """``text`` escaped so Kubernetes' ``$(VAR)`` expansion in env and args leaves it as is."""
    return text.replace("$", "$$")
