"""Creating one launch of a kernel: its Secret and Service (once per kernel; a group of several
pods also its headless group Service) at once, then its pods at once.

`create_launch` makes each object through `create` (the backend's owner-checked create) and
records in a `Progress` what it made and what it was doing, so that a failure can be undone and
told in the user's words, and the priority class its head pod got (`pinned`); `connection` is
the kernel's connection info at the Service. Nothing here keeps state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kernel_queue import errors
from kernel_queue.kube import kueue, names
from kernel_queue.kube.objects import manifests, preflight
from kernel_queue.model import ConnectionInfo, GroupSpec, short_id

Obj = dict[str, Any]
Create = Callable[[kueue.Kind, Obj], Awaitable[Obj]]


@dataclass
class Progress:
    """What a launch created so far (to undo on failure) and what it was doing."""

    created: list[tuple[kueue.Kind, str]] = field(default_factory=list)
    doing: str = "create its objects"
    priority_class: str | None = None
    """The priority class on the head pod as the API server stored it: the kernelspec's, the
    template's, or the one Kueue's webhook gave it (0.20's `default`); None for none."""


def pinned(spec: GroupSpec, progress: Progress) -> GroupSpec:
    """`spec` with the priority class the launch's head pod got, for the group's later pods
    (replacements after a preemption), so each carries it explicitly (see `manifests`)."""
    return replace(spec, priority_class=progress.priority_class or spec.priority_class)


async def create_launch(
    spec: GroupSpec,
    group: str,
    launch: int,
    *,
    owner: str,
    create: Create,
    progress: Progress,
    launcher: str | None = None,
) -> str:
    """Create the kernel's objects for launch `launch` of group `group`; return the address
    clients connect to. A relaunch (launch > 0) finds the Secret and Services of the first one
    and leaves them out of `progress.created`. `launcher`: the ConfigMap of the delivered
    launcher the pods run (`manifests.pods`)."""
    who, namespace = f"kernel {short_id(spec.kernel_id)}", spec.namespace
    ours = [
        (kueue.SECRETS, manifests.secret(spec, owner=owner), "Secret"),
        (kueue.SERVICES, manifests.service(spec, owner=owner), "Service"),
    ]
    if spec.pod_group_size > 1:  # each pod's stable name, for the others
        ours.append((kueue.SERVICES, manifests.group_service(spec, owner=owner), "group Service"))
    pods = manifests.pods(
        spec,
        group,
        0,
        kernel_env=dict(spec.env),
        checkpoint_claim=preflight.claim(spec),
        owner=owner,
        launcher=launcher,
    )
    made: dict[str, Obj] = {}

    async def one(kind: kueue.Kind, body: Obj) -> Obj:
        found = await create(kind, body)
        if kind is kueue.PODS or launch == 0:  # a relaunch keeps the key and the addresses
            progress.created.append((kind, body["metadata"]["name"]))
        return found

    async def together(objects: list[tuple[kueue.Kind, Obj, str]]) -> None:
        """Create `objects` at once; a failure waits for the others (so that `progress`
        holds everything made), then the first is raised."""
        results = await asyncio.gather(
            *(one(kind, body) for kind, body, _ in objects), return_exceptions=True
        )
        for (_, body, word), result in zip(objects, results, strict=True):
            if isinstance(result, BaseException):
                progress.doing = f"create its {word} {body['metadata']['name']}"
                raise result
            made[body["metadata"]["name"]] = result

    # All at once: Kueue's steps start with the pod. A pod made before a Secret or Service is
    # refused is deleted by the failed start's clean-up, then the Workload Kueue made for it.
    await together([*ours, *((kueue.PODS, pod, "pod") for pod in pods)])
    address = _address(spec, made[names.service_name(spec.kernel_id)], who)
    labels = (made[pods[0]["metadata"]["name"]].get("metadata") or {}).get("labels") or {}
    progress.priority_class = labels.get(kueue.PRIORITY_CLASS_LABEL) or None
    for pod in pods:
        found = made[pod["metadata"]["name"]]
        if not kueue.is_gated(found) and not kueue.is_managed(found):
            raise errors.ConfigError(
                f"{who}: namespace {namespace!r} is not managed by Kueue (its pod was created "
                "without Kueue's admission gate, so it would run unqueued); nothing was left "
                "behind. Use a namespace Kueue manages (managedJobsNamespaceSelector) or set "
                "`namespace` in the kernelspec."
            )
    return address


def connection(spec: GroupSpec, address: str) -> ConnectionInfo:
    """The kernel's connection info: `address` and the fixed in-pod ports."""
    ports = manifests.KERNEL_PORTS
    return replace(
        spec.connection,
        ip=address,
        shell_port=ports["shell"],
        iopub_port=ports["iopub"],
        stdin_port=ports["stdin"],
        control_port=ports["control"],
        hb_port=ports["hb"],
    )


def _address(spec: GroupSpec, service: Obj, who: str) -> str:
    """The Service's cluster IP ("" for "connect": "pod-ip", known once the head pod runs)."""
    if spec.connect == "pod-ip":
        return ""
    address = (service.get("spec") or {}).get("clusterIP")
    if not address or address == "None":
        raise errors.LaunchFailed(
            f"{who}: Service {service['metadata']['name']} got no cluster IP; check the "
            'cluster\'s Service CIDR, or set "connect": "pod-ip"'
        )
    return str(address)
