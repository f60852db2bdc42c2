"""Worker mode (``--worker``): the process of a non-head pod in a kernel's pod group.

It needs no ports and no key: it logs its rank, world size and head address from the group's
``KERNEL_QUEUE_*`` variables (``group``), runs the kernelspec's ``worker_command`` (the
launcher's arguments after ``--``) as its child, if there is one, and blocks in
``signal.sigwait`` (no polling) until SIGTERM or SIGINT, which it forwards to the child's
process group; then it exits 143 — never 0: a deleted pod whose containers all exit 0 ends
Succeeded, and Kueue counts a group whose pods all succeeded as finished, never to be requeued
(Kueue: ``Finished`` in pkg/controller/jobs/pod/pod_controller.go). For the same reason a
command that ends on its own does not end the pod: its status is logged (the pod's log) and
the worker waits for SIGTERM as without a command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from kernel_queue import launcher
from kernel_queue.launcher import contract, group

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
WAITED_SIGNALS = STOP_SIGNALS | {signal.SIGCHLD}
START_FAILED_STATUS = 127
"""The status logged for a command that cannot be executed (as a shell reports it)."""

Log = Callable[[str], None]


def describe(environ: Mapping[str, str], command: Sequence[str] = ()) -> str:
    """The line a worker logs when it starts."""
    rank = environ.get(group.ENV_RANK, "?")
    size = environ.get(group.ENV_WORLD_SIZE, "?")
    head = environ.get(group.ENV_HEAD_ADDRESS) or "?"
    doing = f"running {list(command)} until SIGTERM" if command else "waiting for SIGTERM"
    return f"worker rank {rank} of {size}, head at {head}; {doing}"


def run(
    log: Log,
    environ: Mapping[str, str] | None = None,
    command: Sequence[str] = (),
    stop_timeout: float = contract.DEFAULT_BUDGET.stop_timeout,
) -> int:
    """Log one line, run `command` (if any) in the pod's environment, wait for SIGTERM or
    SIGINT, stop the command (SIGKILL to its group `stop_timeout` s after the signal, the
    launcher's ``KERNEL_QUEUE_LAUNCH_STOP_TIMEOUT``: the pod's grace period less the kubelet's
    margin), return 143. Call from the main thread.

    The signals are blocked before the line is logged and the child started (the child gets the
    old mask back before it executes), so a signal or a child's exit is never lost; the old mask
    is restored before returning.
    """
    env = os.environ if environ is None else environ
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, WAITED_SIGNALS)
    try:
        log(describe(env, command))
        child = _start(command, env, previous, log) if command else None
        while True:
            signum = signal.sigwait(WAITED_SIGNALS)
            if signum in STOP_SIGNALS:
                break
            if _reap(child) and child is not None:
                _ended(child, log)
                child = None
        log(f"{signal.Signals(signum).name}: the worker stops")
        if child is not None:
            _stop(child, signum, stop_timeout, log)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return launcher.PREEMPTED_EXIT_CODE


def _start(
    command: Sequence[str], env: Mapping[str, str], mask: set[int | signal.Signals], log: Log
) -> subprocess.Popen[bytes] | None:
    """The command in its own process group (SIGTERM reaches all it started), with the launcher's
    mask restored and SIGKILL on the launcher's death (so it never outlives the pod's process);
    None, logged, where it cannot be executed."""
    from kernel_queue.launcher import supervisor  # prctl; imported only with a command

    parent = os.getpid()

    def before_exec() -> None:  # in the child, after setsid
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        supervisor.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    try:
        return subprocess.Popen(
            list(command), env=dict(env), start_new_session=True, preexec_fn=before_exec
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log(
            f"cannot start the worker command {command[0]!r} (status {START_FAILED_STATUS}: "
            f"{exc}); the pod stays up until SIGTERM, as a worker of its group"
        )
        return None


def _ended(child: subprocess.Popen[bytes], log: Log) -> None:
    status = launcher.shell_status(child.returncode)
    _kill_group(child.pid)  # what it left in its group
    log(
        f"the worker command exited with status {status}; the pod stays up until SIGTERM, as a "
        "worker of its group (a pod that ended would end the group)"
    )


def _stop(child: subprocess.Popen[bytes], signum: int, timeout: float, log: Log) -> None:
    """Forward `signum` to the command's group, wait up to `timeout` s for it (SIGCHLD), then
    SIGKILL the group; reaped either way."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signum)
    deadline = timeout
    while not _reap(child) and deadline > 0:
        waited = time.monotonic()
        signal.sigtimedwait({signal.SIGCHLD}, deadline)
        deadline -= time.monotonic() - waited
    if child.returncode is None:
        log(f"the worker command did not exit {timeout:g} s after the signal; sending SIGKILL")
        _kill_group(child.pid)
        child.wait()
    else:
        _kill_group(child.pid)
    log(f"the worker command exited with status {launcher.shell_status(child.returncode)}")


def _reap(child: subprocess.Popen[bytes] | None) -> bool:
    """Reap every exited child (as a container's PID 1 that includes orphans, which would
    otherwise stay zombies); True once `child` has exited (its ``returncode`` is set here)."""
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if child is not None and pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(wait_status)  # reaped here, not by Popen
    return child is not None and child.returncode is not None


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
