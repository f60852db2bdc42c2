"""Why a kernel's pod could not start the launcher, in the words of its fix (pure).

`ended` reads the head pod's kernel container once it ended before it was ready: an image whose
runtime could not execute ``python`` (the kubelet's ``StartError``), an image without ipykernel
(the launcher's one line in the termination message, status ``IMAGE_EXIT_CODE``), or a kernel
that crashed. `missing_launcher` is said when the pod waits on a launcher ConfigMap that is gone.
No I/O: the pod is a dict from the informer's cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel_queue import launcher
from kernel_queue.kube import kueue
from kernel_queue.kube.objects import launcher_archive

NEEDS = (
    "the image needs Python 3.10 or newer with ipykernel on its PATH (the server delivers the "
    "rest); use one that has them (e.g. quay.io/jupyter/base-notebook) or build one from "
    "etc/images/Dockerfile"
)


def ended(pod: Mapping[str, Any], container: str = "kernel") -> str:
    """The sentence for ``pod``'s ``container`` that ended before it was ready."""
    name = str((pod.get("metadata") or {}).get("name", "?"))
    image = _image(pod, container)
    state = _terminated(pod, container)
    code = state.get("exitCode")
    message = str(state.get("message") or "").strip()
    if state.get("reason") == "StartError" or code == 128:
        why = f": {_tail(message)}" if message else ""
        return f"image {image} cannot run the launcher{why}; {NEEDS}"
    if code == launcher.IMAGE_EXIT_CODE and message.startswith("no module named ipykernel"):
        return (
            f"image {image} has no ipykernel: {message}; add ipykernel to the image "
            "(pip install ipykernel) or use an image that has it, e.g. "
            "quay.io/jupyter/base-notebook or one built from etc/images/Dockerfile"
        )
    if code == launcher.IMAGE_EXIT_CODE and message:
        return f"image {image} cannot run a kernel: {message}; {NEEDS}"
    said = f" ({message})" if message else ""
    return f"the kernel's pod {name} ended with exit code {code} before it was ready{said}"


def missing_launcher(configmap: str, namespace: str) -> str:
    """The sentence for a pod that cannot mount the launcher's ConfigMap, deleted meanwhile."""
    return (
        f"the launcher's ConfigMap {configmap} in namespace {namespace!r} is gone (configmap "
        f'"{configmap}" not found), so the pod cannot mount it; the server makes it again for '
        "the next kernel: start this one again"
    )


def launcher_configmap(pod: Mapping[str, Any]) -> str | None:
    """The name of the launcher ConfigMap ``pod`` mounts, or None."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if volume.get("name") == launcher_archive.VOLUME:
            return str((volume.get("configMap") or {}).get("name") or "") or None
    return None


def creating(pod: Mapping[str, Any]) -> bool:
    """True while ``pod`` is bound and its containers are still being created (mounts, pulls)."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending" or kueue.is_gated(pod):
        return False
    states = [s.get("state") or {} for s in status.get("containerStatuses") or []]
    waiting = [str((s.get("waiting") or {}).get("reason") or "") for s in states]
    return bool(waiting) and all(reason in kueue.STARTING_REASONS for reason in waiting)


def _terminated(pod: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return ((status.get("state") or {}).get("terminated")) or {}
    return {}


def _image(pod: Mapping[str, Any], container: str) -> str:
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if spec.get("name") == container:
            return str(spec.get("image") or "?")
    return "?"


def _tail(message: str) -> str:
    """The part of a runtime's error a user acts on: from ``exec:`` on, without ``: unknown``."""
    start = message.find("exec: ")
    found = message[start:] if start >= 0 else message
    return found.removesuffix(": unknown")
