"""The launch contract: every ``KERNEL_QUEUE_LAUNCH_*`` variable, its one rendering and its parsing.

Both backends describe a launch as a ``Launch`` and ``render`` it into env; the launcher
(``settings``) and its kernel (``checkpointing``) parse that env here, and a bad value is always a
``SettingsError`` naming the variable. ``budget`` turns the grace period into every deadline that
follows SIGTERM. Stdlib only (`errors` is too): this runs in the kernel image and in the server.
Its records are ``NamedTuple``s, not dataclasses: the launcher reads this module before it
starts the kernel, and ``dataclasses`` (with ``inspect``) would cost it ~15 ms more.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from kernel_queue.errors import ConfigError

PREFIX = "KERNEL_QUEUE_LAUNCH_"
"""Every launcher input starts so; a kernel's own env never passes one on (``kernel_env``)."""
ENV_IP = PREFIX + "IP"
ENV_PORTS = PREFIX + "PORTS"
ENV_KEY = PREFIX + "KEY"
ENV_KEY_FILE = PREFIX + "KEY_FILE"
ENV_TRANSPORT = PREFIX + "TRANSPORT"
ENV_SIGNATURE_SCHEME = PREFIX + "SIGNATURE_SCHEME"
ENV_STATUS_FD = PREFIX + "STATUS_FD"
ENV_PARENT_DEATH = PREFIX + "PARENT_DEATH"
ENV_STOP_TIMEOUT = PREFIX + "STOP_TIMEOUT"
ENV_MODE = PREFIX + "MODE"
"""``kernel`` (the default) or ``worker``; ``--worker`` on the command line wins."""
ENV_FORK = PREFIX + "FORK"
"""``0``: start kernel-queue's kernel as a new program, not in a fork of the launcher."""
ENV_TERMINATION_LOG = PREFIX + "TERMINATION_LOG"
ENV_STOP_NOTE = PREFIX + "STOP_NOTE"
"""A file where the backend says, just before its SIGTERM, why the kernel stops ("preempted
by ...", "parked"): the kernel's notice says so. Unset or absent: the notice says it cannot tell."""
"""File that receives the checkpoint sentence after a preemption (else /dev/termination-log)."""
ENV_GENERATION = PREFIX + "GENERATION"
"""Set by the launcher for each kernel it starts: 0 for the first, one more per in-place restart."""
ENV_CHECKPOINT_DIR = PREFIX + "CHECKPOINT_DIR"
"""The kernel's checkpoint store directory; unset, the kernel neither saves nor restores."""
ENV_CHECKPOINT_DEADLINE = PREFIX + "CHECKPOINT_DEADLINE"
"""Seconds after SIGTERM the kernel's save may take (``Budget.save_deadline``)."""
ENV_CHECKPOINT_KEEP = PREFIX + "CHECKPOINT_KEEP"
"""``1``: keep the checkpoints after a final shutdown_request; otherwise the kernel deletes them."""
ENV_CHECKPOINT_CONTINUOUS = PREFIX + "CHECKPOINT_CONTINUOUS"
"""``0``: the kernel saves only on SIGTERM; otherwise (unset, the default) also after each cell,
in the background, what the cell changed (``checkpoint.continuous``)."""
ENV_CHECKPOINT_REPORT = PREFIX + "CHECKPOINT_REPORT"
"""Set by the launcher: where a preempted kernel writes its JSON checkpoint report."""
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default ``terminationMessagePath``; used only when it exists and is writable."""

DEFAULT_GRACE_SECONDS = 30.0
"""A kernel's grace period when its kernelspec gives none (``checkpoint.grace_seconds``)."""
KUBELET_MARGIN_SECONDS = 5
"""Pods only: grace left after the launcher's stop timeout, to SIGKILL and reap a kernel that
missed it and still exit 143 before the kubelet SIGKILLs the launcher."""
LOCAL_KILL_MARGIN_SECONDS = 1.0
"""Local only: the backend SIGKILLs the launcher this long after the grace period, which is all
the stop timeout there, so a launcher that had to SIGKILL its kernel still reaps it and exits."""
COMMIT_MARGIN_SECONDS = 3.0
"""Between the save's deadline and the stop timeout: the kernel still abandons a late save
(``SAVE_SLACK_SECONDS``), reports and leaves its loops (``PREEMPTED_EXIT_SECONDS``)."""
MIN_SAVE_SECONDS = 1.0
"""The least time a save gets after SIGTERM; a grace period that leaves less is refused."""
SAVE_SLACK_SECONDS = 1.0
"""A save still running this long after its deadline is abandoned and the kernel exits."""
PREEMPTED_EXIT_SECONDS = 2.0
"""A preempted kernel whose save ended gets this long to leave its loops before ``os._exit``."""
SHUTDOWN_EXIT_SECONDS = 10.0
"""After a shutdown_request the interpreter gets this long to finish exiting (user threads,
atexit) before ``os._exit``. No SIGKILL follows a shutdown, so this is outside the budget."""
CELL_WAIT_SECONDS = 2.0
"""After SIGTERM the running cell gets this long (at most a quarter of the deadline, at least
``MIN_CELL_WAIT_SECONDS``) to reach a cell boundary before a helper thread saves concurrently."""
MIN_CELL_WAIT_SECONDS = 0.25


class SettingsError(ConfigError):
    """A launcher input is missing or invalid; the message names the option and the variable."""


class Budget(NamedTuple):
    """One kernel's time after SIGTERM, each field in seconds from the signal."""

    grace: float
    """Until the kubelet SIGKILLs the launcher (locally ``LOCAL_KILL_MARGIN_SECONDS`` later)."""
    stop_timeout: float
    """Until the launcher SIGKILLs the kernel (``KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT``)."""
    save_deadline: float
    """Until the save must have committed (``KERNEL_QUEUE_LAUNCH_CHECKPOINT_DEADLINE``)."""


def budget(grace_seconds: float, *, pod: bool) -> Budget:
    """The whole time budget from a kernel's grace period.

    In a pod the grace is whole seconds (``terminationGracePeriodSeconds``, at least 1) and the
    stop timeout leaves ``KUBELET_MARGIN_SECONDS`` of it; locally the stop timeout is the whole
    grace. The save ends ``COMMIT_MARGIN_SECONDS`` before the stop timeout. Each is at least 1 s.
    """
    if pod:
        grace = float(max(1, int(grace_seconds)))
        stop = max(1.0, grace - KUBELET_MARGIN_SECONDS)
    else:
        grace = stop = grace_seconds
    return Budget(grace, stop, max(MIN_SAVE_SECONDS, stop - COMMIT_MARGIN_SECONDS))


def min_grace_seconds(*, pod: bool) -> int:
    """The least grace period whose budget leaves ``MIN_SAVE_SECONDS`` for the save."""
    margin = COMMIT_MARGIN_SECONDS + MIN_SAVE_SECONDS + (KUBELET_MARGIN_SECONDS if pod else 0)
    return math.ceil(margin)


def cell_wait(save_deadline: float) -> float:
    """Seconds the running cell gets to reach a boundary before the save runs beside it."""
    return min(CELL_WAIT_SECONDS, max(MIN_CELL_WAIT_SECONDS, save_deadline / 4))


DEFAULT_BUDGET = budget(DEFAULT_GRACE_SECONDS, pod=True)
"""What a launcher started without a stop timeout or a deadline uses: a default pod's budget."""


class Launch(NamedTuple):
    """What a backend tells one launcher; ``render`` turns it into env."""

    grace_seconds: float
    pod: bool
    """The launcher is a pod's PID 1 (``budget``'s kubelet margin applies)."""
    ports: Sequence[int]
    """Shell, iopub, stdin, control and hb."""
    ip: str | None = None
    """None: the backend sets ``ENV_IP`` itself (a pod's IP, from the downward API)."""
    key: str | None = None
    """None: the backend sets ``ENV_KEY`` itself (from the kernel's Secret)."""
    transport: str | None = None
    signature_scheme: str | None = None
    status_fd: int | None = None
    parent_death: bool = False
    checkpoint_dir: str | None = None
    """Where the kernel saves and restores; None: checkpoints are off."""
    keep_checkpoints: bool = False
    continuous_checkpoints: bool = True
    """Checkpoint after each cell too (``checkpoint.continuous``); only with ``checkpoint_dir``."""
    termination_log: str | None = None
    stop_note: str | None = None
    """``ENV_STOP_NOTE``'s file (the local backend's; a pod's SIGTERM comes with no note)."""


def render(launch: Launch) -> dict[str, str]:
    """The ``KERNEL_QUEUE_LAUNCH_*`` env of ``launch``; the same launch gives the same dict."""
    times = budget(launch.grace_seconds, pod=launch.pod)
    found = {ENV_IP: launch.ip, ENV_PORTS: ",".join(map(str, launch.ports)), ENV_KEY: launch.key}
    found.update({ENV_TRANSPORT: launch.transport, ENV_SIGNATURE_SCHEME: launch.signature_scheme})
    if launch.status_fd is not None:
        found[ENV_STATUS_FD] = str(launch.status_fd)
    found[ENV_PARENT_DEATH] = "1" if launch.parent_death else None
    found[ENV_STOP_TIMEOUT] = _seconds(times.stop_timeout)
    if launch.checkpoint_dir:
        found[ENV_CHECKPOINT_DIR] = launch.checkpoint_dir
        found[ENV_CHECKPOINT_DEADLINE] = _seconds(times.save_deadline)
        found[ENV_CHECKPOINT_KEEP] = "1" if launch.keep_checkpoints else None
        found[ENV_CHECKPOINT_CONTINUOUS] = None if launch.continuous_checkpoints else "0"
    found[ENV_TERMINATION_LOG] = launch.termination_log
    found[ENV_STOP_NOTE] = launch.stop_note
    return {name: value for name, value in found.items() if value is not None}


def kernel_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without any ``KERNEL_QUEUE_LAUNCH_*``: only ``render`` sets those."""
    return {name: value for name, value in env.items() if not name.startswith(PREFIX)}


def _seconds(value: float) -> str:
    text = repr(float(value))
    return text.removesuffix(".0")


class Checkpointing(NamedTuple):
    """The kernel's checkpoint inputs, parsed."""

    directory: str
    deadline: float
    """Seconds after SIGTERM the save may take."""
    keep: bool
    report: str | None
    """Where the kernel writes its report for the launcher; None: nowhere."""
    continuous: bool = True
    """Also checkpoint after each cell, in the background (``ENV_CHECKPOINT_CONTINUOUS``)."""


def parse_checkpointing(environ: Mapping[str, str]) -> Checkpointing | None:
    """The ``KERNEL_QUEUE_LAUNCH_CHECKPOINT_*`` inputs; None when checkpointing is off.

    Called by the launcher (so bad input stops it before any kernel starts) and by the kernel.
    """
    directory = environ.get(ENV_CHECKPOINT_DIR)
    if not directory:
        return None
    deadline = parse_seconds(
        environ.get(ENV_CHECKPOINT_DEADLINE),
        ENV_CHECKPOINT_DEADLINE,
        DEFAULT_BUDGET.save_deadline,
        what="checkpoint deadline",
        positive=True,
    )
    return Checkpointing(
        directory=directory,
        deadline=deadline,
        keep=parse_flag(environ.get(ENV_CHECKPOINT_KEEP, ""), ENV_CHECKPOINT_KEEP),
        report=environ.get(ENV_CHECKPOINT_REPORT) or None,
        continuous=parse_flag(
            environ.get(ENV_CHECKPOINT_CONTINUOUS, "") or "1", ENV_CHECKPOINT_CONTINUOUS
        ),
    )


def parse_generation(environ: Mapping[str, str]) -> int | None:
    """The kernel's generation; None when no launcher started it (the variable is unset)."""
    raw = environ.get(ENV_GENERATION)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise SettingsError(f"invalid {ENV_GENERATION}={raw!r}: set it to a number >= 0")
    return int(raw)


def parse_seconds(
    raw: str | None,
    name: str,
    default: float,
    *,
    what: str,
    option: str | None = None,
    positive: bool = False,
) -> float:
    """``raw`` as finite seconds, >= 0 or (``positive``) > 0; ``default`` when empty.

    The error names ``what`` the value is, the variable ``name`` and the ``option`` if any."""
    if raw is None or raw == "":
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and (seconds > 0 if positive else seconds >= 0)):
        where = f"{option} or {name}" if option else name
        bound = "> 0" if positive else ">= 0"
        raise SettingsError(f"invalid {what} {raw!r}: set {where} to a number of seconds {bound}")
    return seconds


def parse_flag(raw: str, name: str, option: str | None = None) -> bool:
    """``1``/``true``/``yes`` or ``0``/``false``/``no``/empty; the error names ``name``."""
    value = raw.strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    fix = f", or pass {option}" if option else ""
    raise SettingsError(f"invalid {name}={raw!r}: set it to 1 or 0{fix}")


STOP_NOTE_LIMIT = 500
"""Characters of a stop note the kernel reads."""


def read_stop_note(environ: Mapping[str, str]) -> str:
    """Why the backend stops the kernel (``ENV_STOP_NOTE``'s file, taken: it is removed),
    one line; '' when the backend said nothing."""
    path = environ.get(ENV_STOP_NOTE)
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            text = file.read(STOP_NOTE_LIMIT)
        os.unlink(path)
    except OSError:
        return ""
    return " ".join(text.split())


def write_stop_note(path: str, text: str) -> None:
    """The backend's side of ``read_stop_note``: atomically, private to the user."""
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temporary, path)
