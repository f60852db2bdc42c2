"""The jupyter_events schema of queued-kernel status, and the payload of one event.

The server extension registers `SCHEMA_PATH` at server start (never lazily: listeners attach
only to schemas registered when they subscribe); the provisioner emits `SCHEMA_ID` events. The
schema grows by optional fields only, its `version` bumped each time (2 added
`estimated_wait_seconds`, 3 the state `parked` with `parks` and `parked_since`, 4 `failure`:
what kind of failure a `failed` kernel met, 5 what the sentence says as fields: `needs`, `has`,
`priority_class`, `saving`, `waking`), under the same `$id`, so consumers of an earlier version
keep working. JupyterLab's extension reads the fields, never the sentence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from kernel_queue import errors
from kernel_queue import lifecycle as lifecycles
from kernel_queue.lifecycle import KernelState, Lifecycle
from kernel_queue.model import GroupPhase, GroupSpec, GroupStatus

SCHEMA_ID = "https://events.kernel-queue.dev/kernel-status/v1"
SCHEMA_PATH = Path(__file__).parent / "schemas" / "kernel-status.yaml"

FAILURES: tuple[tuple[type[errors.KernelQueueError], str], ...] = (
    (errors.NeverFits, "never_fits"),
    (errors.QueueNotFound, "queue_not_found"),
    (errors.PriorityClassNotFound, "priority_class_not_found"),
    (errors.ConfigError, "config"),
    (errors.AdmissionTimeout, "admission_timeout"),
    (errors.StartupTimeout, "startup_timeout"),
    (errors.LaunchCancelled, "cancelled"),
)
"""The schema's `failure` kinds by error class (the first that matches); any other: "launch"."""


def failure_kind(error: BaseException | None) -> str | None:
    """The schema's `failure` for `error` (None for no error)."""
    if error is None:
        return None
    return next((kind for cls, kind in FAILURES if isinstance(error, cls)), "launch")


def failure_has(error: BaseException | None) -> dict[str, int | str] | None:
    """What the queue could ever give, for the schema's `has`, where the error says it (its
    `has` attribute: {"gpus": 2}, {"cpu": "16"}); None otherwise."""
    has = getattr(error, "has", None)
    if not isinstance(has, Mapping):
        return None
    return {
        str(k): v for k, v in has.items() if isinstance(v, int | str) and not isinstance(v, bool)
    }


def _needs(spec: object) -> str | None:
    """The schema's `needs`: a `GroupSpec`'s `needs()`, a `Noted`'s `needs`; None if unknown."""
    needs = getattr(spec, "needs", None)
    words = needs() if callable(needs) else needs
    return words if isinstance(words, str) and words else None


def _checkpoints(spec: object) -> bool:
    """Whether the kernel saves its variables when stopped (a `Noted`, or a `GroupSpec`)."""
    if isinstance(spec, GroupSpec):
        return spec.checkpoint.enabled
    return bool(getattr(spec, "checkpoints", False))


class Subject(Protocol):
    """What an event says of the kernel itself: a `GroupSpec`, or what a front end persisted
    of one (`model.Noted`, for a kernel reattached after a restart)."""

    @property
    def kernel_id(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def gpus(self) -> int: ...


def status_payload(
    spec: Subject,
    backend: str,
    lifecycle: Lifecycle,
    status: GroupStatus,
    message: str,
    *,
    parked_since: str | None = None,
    failure: str | None = None,
    has: Mapping[str, int | str] | None = None,
) -> dict[str, Any]:
    """The event data (and the REST listing entry) for one kernel's current state;
    `parked_since` (ISO 8601) while it is parked; `failure` (`failure_kind`) and `has`
    (`failure_has`) once it failed."""
    waiting = lifecycle.state in (KernelState.QUEUED, KernelState.REQUEUED)
    place = status.place if waiting else None
    estimate = status.waiting.estimate if waiting and status.waiting else None
    shown = lifecycles.shown(lifecycle)
    failed = lifecycle.state is KernelState.FAILED
    saving = (shown is KernelState.PARKED and status.phase is GroupPhase.PARKING) or (
        shown is KernelState.PREEMPTED and _checkpoints(spec)
    )
    return {
        "kernel_id": spec.kernel_id,
        "state": str(shown),  # the schema's states: no "restarting"
        "backend": backend,
        "queue": place.queue if place else spec.queue,
        "position": place.position if place else None,
        "queue_length": place.length if place else None,
        "estimated_wait_seconds": round(estimate) if estimate is not None else None,
        "gpus": spec.total_gpus if isinstance(spec, GroupSpec) else spec.gpus,
        "devices": list(status.devices),
        "preemptions": lifecycle.preemptions,
        "parks": lifecycle.parks,
        "parked_since": parked_since if lifecycle.state is KernelState.PARKED else None,
        "failure": failure if failed else None,
        "needs": _needs(spec),
        "has": dict(has) if failed and has else None,
        "priority_class": getattr(spec, "priority_class", None),
        "saving": saving,
        "waking": shown is KernelState.REQUEUED and lifecycle.waking,
        "message": message,
    }


def failed_payload(
    spec: GroupSpec,
    backend: str,
    error: BaseException,
    seen: tuple[Lifecycle, GroupStatus] | None = None,
) -> dict[str, Any]:
    """The payload of a kernel whose launch failed outside its lifecycle (the backend refused
    the submission, say): state `failed`, the error's sentence and its `failure` kind; `seen`:
    its last lifecycle and status, if it was followed."""
    lifecycle, status = seen or (Lifecycle(), GroupStatus(GroupPhase.FAILED))
    return status_payload(
        spec,
        backend,
        dataclasses.replace(lifecycle, state=KernelState.FAILED),
        status,
        str(error),
        failure=failure_kind(error),
        has=failure_has(error),
    )


def refused_payload(kernel_id: str, config: dict[str, Any], error: BaseException) -> dict[str, Any]:
    """The payload of a kernel whose kernelspec config was refused before anything was built or
    submitted: what the config said of its backend, queue and GPUs, as far as it is readable."""
    gpus = config.get("gpus")
    priority_class = config.get("priority_class")
    return {
        "kernel_id": kernel_id,
        "state": str(KernelState.FAILED),
        "backend": str(config.get("backend") or ""),
        "queue": str(config.get("queue") or ""),
        "gpus": gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0 else 0,
        "position": None,
        "queue_length": None,
        "estimated_wait_seconds": None,
        "devices": [],
        "preemptions": 0,
        "parks": 0,
        "parked_since": None,
        "failure": failure_kind(error),
        "needs": None,
        "has": failure_has(error),
        "priority_class": priority_class if isinstance(priority_class, str) else None,
        "saving": False,
        "waking": False,
        "message": str(error),
    }
