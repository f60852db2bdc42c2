"""Entry point of ``python -m kernel_queue.launcher``: PID 1 of a kernel pod, or a local subprocess.

It reads the settings, optionally arms the parent-death signal, and hands over to the supervisor;
bad input ends here with one line on stderr and status 2, before any file or process exists.
Stdlib and ``kernel_queue.launcher`` only: this runs in the kernel image.

``--spare`` is a launcher started ahead of its kernel (the local backend keeps one, so that an
admitted kernel does not wait for Python's start and these imports): it waits on stdin for one
JSON object, ``{"argv": [...], "env": {...}, "cwd": ..., "log": ...}``, written by the server
before it closes the pipe, then takes that environment, folder and log as its own and runs as if
started with them. An empty stdin (the server closed it without a kernel) ends it with status 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence

from kernel_queue import launcher
from kernel_queue.launcher import contract, settings, supervisor

USAGE_ERROR_EXIT_CODE = 2


SPARE_FLAG = "--spare"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the launcher until its kernel ends for good; return the launcher's exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [SPARE_FLAG]:
        return spare()
    parent = os.getppid()
    try:
        config = settings.parse_settings(args, os.environ)
    except contract.SettingsError as exc:
        supervisor.log(f"error: {exc}")
        return USAGE_ERROR_EXIT_CODE
    if (
        config.parent_death
        and supervisor.set_parent_death_signal(signal.SIGTERM)
        and os.getppid() != parent
    ):
        supervisor.log("the parent process is already gone; not starting the kernel")
        return launcher.PREEMPTED_EXIT_CODE
    return supervisor.Supervisor(config).run()


def spare() -> int:
    """Wait for a kernel's launch on stdin, take it on (environment, folder, log) and run it."""
    parent = os.getppid()
    if supervisor.set_parent_death_signal(signal.SIGTERM) and os.getppid() != parent:
        return 0  # the server is gone already
    data = sys.stdin.buffer.read()
    if not data:
        return 0
    try:
        launch = _handoff(json.loads(data))
    except (ValueError, TypeError) as exc:
        supervisor.log(f"error: a spare launcher was handed no launch it can read ({exc})")
        return USAGE_ERROR_EXIT_CODE
    argv, env, cwd, log_path = launch
    try:
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as exc:
        supervisor.log(f"error: cannot open the kernel's log {log_path} ({exc})")
        return supervisor.START_FAILED_EXIT_CODE
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            supervisor.log(f"cannot start the kernel in {cwd} ({exc})")
            return supervisor.START_FAILED_EXIT_CODE
    os.environ.clear()
    os.environ.update(env)
    return main(argv)


def _handoff(value: object) -> tuple[list[str], dict[str, str], str, str]:
    """The launch a spare was handed: its arguments, environment, folder ("" for its own) and
    log file; TypeError naming what is not of its kind."""
    if not isinstance(value, dict):
        raise TypeError("not a JSON object")
    argv, env = value.get("argv"), value.get("env")
    cwd, log_path = value.get("cwd") or "", value.get("log")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise TypeError("'argv' is not a list of strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise TypeError("'env' is not an object of strings")
    if not isinstance(cwd, str) or not isinstance(log_path, str) or not log_path:
        raise TypeError("'cwd' or 'log' is not a string")
    return argv, env, cwd, log_path


if __name__ == "__main__":
    sys.exit(main())
