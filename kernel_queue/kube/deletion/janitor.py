"""The checkpoints of a parked kernel that ends, deleted from its claim by one short pod.

A running kernel deletes its own checkpoint directory at its final `shutdown_request` (unless
`checkpoint.keep`). A parked one has no process, and the server does not mount the claim; so
when a parked group ends, `clean` runs one pod of the kernel's image outside Kueue (no Kueue
label, no GPU, a little CPU and memory), mounting the claim and removing the kernel's own
directory on it (the `subPath` its head pod mounts), waits for it to end (at most `within`
seconds, one watch of that pod) and deletes it. What stops it (RBAC, quota, a claim it cannot
mount) is said in a sentence the backend logs; the kernel's other objects go regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kernel_queue import errors
from kernel_queue.kube import kueue
from kernel_queue.kube.client import retries
from kernel_queue.kube.client.verbs import KubeApi
from kernel_queue.kube.objects import manifests
from kernel_queue.launcher import contract
from kernel_queue.model import short_id

Obj = dict[str, Any]
Log = logging.Logger | logging.LoggerAdapter[Any]
ROLE = "checkpoint-cleanup"
"""Its `kernel-queue.dev/role`: ours (the reaper finds a leftover one), never a kernel's."""
MOUNT = "/claim"
CODE = "import shutil, sys; shutil.rmtree(sys.argv[1]); print('deleted', sys.argv[1])"
RESOURCES = {"cpu": "50m", "memory": "64Mi"}
WITHIN = 60.0
"""Seconds the cleanup pod may take, scheduling and image pull included."""
ENDED = ("Succeeded", "Failed")
CREATE_RETRIES = retries.Backoff(first=0.5, largest=4.0, budget=15.0)
"""How long the cleanup pod's create is tried again through 5xx and 429 answers."""


def _named(items: Any, name: str) -> Mapping[str, Any] | None:
    return next((i for i in items or [] if isinstance(i, Mapping) and i.get("name") == name), None)


def manifest(head: Mapping[str, Any]) -> Obj | None:
    """The cleanup pod of the kernel whose last head pod is `head`; None when it keeps its
    checkpoints or mounts no checkpoint claim."""
    spec = head.get("spec") or {}
    kernel = _named(spec.get("containers"), manifests.KERNEL_CONTAINER) or {}
    keep = _named(kernel.get("env"), contract.ENV_CHECKPOINT_KEEP) or {}
    mount = _named(kernel.get("volumeMounts"), manifests.CHECKPOINT_VOLUME) or {}
    volume = _named(spec.get("volumes"), manifests.CHECKPOINT_VOLUME) or {}
    if keep.get("value") == "1" or not mount.get("subPath") or not volume:
        return None
    meta = head.get("metadata") or {}
    labels = {
        k: v for k, v in (meta.get("labels") or {}).items() if not k.startswith(kueue.KUEUE_PREFIX)
    }
    labels[kueue.ROLE_LABEL] = ROLE
    group = str((meta.get("labels") or {}).get(kueue.POD_GROUP_NAME_LABEL) or meta.get("name"))
    container = {
        "name": "cleanup",
        "image": kernel.get("image"),
        "command": ["python", "-c", CODE, f"{MOUNT}/{mount['subPath']}"],
        "volumeMounts": [{"name": manifests.CHECKPOINT_VOLUME, "mountPath": MOUNT}],
        "resources": {"requests": dict(RESOURCES), "limits": dict(RESOURCES)},
        **({"securityContext": kernel["securityContext"]} if "securityContext" in kernel else {}),
    }
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [dict(volume)],
        **{k: spec[k] for k in ("securityContext", "serviceAccountName") if k in spec},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{group}-cleanup", "labels": labels},
        "spec": pod_spec,
    }


async def clean(
    api: KubeApi, namespace: str, pods: Sequence[Obj], *, log: Log, within: float = WITHIN
) -> None:
    """Delete the parked kernel's checkpoint directory (its head among `pods`) with a cleanup
    pod; what is left, and why, is logged as a warning."""
    left = await _clean(api, namespace, pods, within)
    if left:
        kernel = (pods[0]["metadata"].get("labels") or {}).get(kueue.KERNEL_ID_LABEL, "?")
        log.warning("kernel %s: %s", short_id(kernel), left)


async def _clean(api: KubeApi, namespace: str, pods: Sequence[Obj], within: float) -> str:
    heads = [p for p in pods if (p["metadata"].get("labels") or {}).get(kueue.ROLE_LABEL) == "head"]
    head = max(heads, key=lambda p: str(p["metadata"].get("creationTimestamp", "")), default=None)
    body = manifest(head) if head is not None else None
    if body is None:
        return ""
    name = body["metadata"]["name"]
    claim = body["spec"]["volumes"][0]["persistentVolumeClaim"].get("claimName", "?")
    directory = body["spec"]["containers"][0]["command"][-1].removeprefix(MOUNT + "/")
    left = f"its checkpoints (directory {directory!r} of claim {claim!r}) stay"
    try:
        await _create(api, namespace, body)
        phase = await _ended(api, namespace, name, within)
    except errors.ClusterApiError as exc:
        phase = f"the cleanup pod {name} could not run ({exc.message})"
    except TimeoutError:
        phase = f"the cleanup pod {name} did not end within {within:g} s"
    finally:
        # If this fails, the release deletes every pod of the kernel next, or the reaper does.
        with contextlib.suppress(errors.ClusterApiError):
            await api.delete(kueue.PODS, namespace, name, grace_seconds=0)
    if phase == "Succeeded":
        return ""
    if phase == "Failed":
        phase = f"the cleanup pod {name} failed (kubectl logs shows why, until it is deleted)"
    return f"{left}: {phase}; delete that directory by hand"


async def _create(api: KubeApi, namespace: str, body: Obj) -> None:
    """Create the cleanup pod, again after a 5xx, a 429 or a lost answer (bounded): its name is
    fixed, so one already there (an earlier try's, its answer lost) is the pod itself."""

    async def once() -> None:
        with contextlib.suppress(errors.ClusterConflict):
            await api.create(kueue.PODS, namespace, body)

    await retries.retry(once, CREATE_RETRIES)


async def _ended(api: KubeApi, namespace: str, name: str, within: float) -> str:
    """The pod's final phase, from one watch of it."""
    field = f"metadata.name={name}"
    async with asyncio.timeout(within):
        while True:
            items, version = await api.list(kueue.PODS, namespace, field_selector=field)
            for pod in items:
                if (pod.get("status") or {}).get("phase") in ENDED:
                    return str(pod["status"]["phase"])
            stream = api.watch(
                kueue.PODS,
                namespace,
                resource_version=version,
                field_selector=field,
                timeout_seconds=max(1, int(within)),
            )
            try:
                async for kind, pod in stream:
                    phase = (pod.get("status") or {}).get("phase")
                    if kind == "DELETED":
                        return "its cleanup pod was deleted"
                    if phase in ENDED:
                        return str(phase)
            finally:
                await stream.aclose()
