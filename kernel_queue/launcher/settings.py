"""The launcher's inputs: command-line options, each falling back to a KERNEL_QUEUE_LAUNCH_* name.

``parse_settings`` turns argv and the environment (names and parsers from ``contract``) into a
frozen ``LaunchSettings`` or raises ``contract.SettingsError`` with one sentence naming the option
and the variable to fix. It only reads: it creates no files and starts no processes (stdlib
only). ``--worker`` needs no ports or key. It runs before the kernel starts, so what only some
launches need is imported only by them: ``argparse`` where options come before ``--`` (the
backends pass none), ``hashlib`` for a signature scheme other than the default.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, NamedTuple

from kernel_queue.launcher import contract, origin

if TYPE_CHECKING:
    import argparse

CONNECTION_FILE_PLACEHOLDER = "{connection_file}"
PORT_NAMES = ("shell", "iopub", "stdin", "control", "hb")
TRANSPORTS = ("tcp", "ipc")
MODES = ("kernel", "worker")
DEFAULT_SIGNATURE_SCHEME = "hmac-sha256"
NO_PORTS = (0, 0, 0, 0, 0)
"""The ports of worker-mode settings, which open none."""


class LaunchSettings(NamedTuple):
    """Everything the supervisor needs, validated."""

    ip: str
    ports: tuple[int, int, int, int, int]
    """Kernel ports in the order shell, iopub, stdin, control, hb."""
    key: str
    transport: str
    signature_scheme: str
    kernel_argv: tuple[str, ...]
    """Kernel command; ``{connection_file}`` is replaced by the connection file's path."""
    status_fd: int | None = None
    """Inherited descriptor that receives one JSON event per line, or None."""
    parent_death: bool = False
    """Ask Linux to SIGTERM the launcher when its parent dies (local backend)."""
    stop_timeout: float = contract.DEFAULT_BUDGET.stop_timeout
    """Seconds a SIGTERMed kernel (or worker command) gets to exit before SIGKILL."""
    worker: bool = False
    """Worker mode: no kernel, ports or key (those fields stay empty); run ``kernel_argv`` (the
    worker command, or none) and wait for SIGTERM."""
    checkpointing: bool = False
    """The kernel saves its state on SIGTERM (``KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR`` is set)."""
    termination_log: str | None = None
    """File for the checkpoint sentence after a preemption (Kubernetes' termination message)."""
    fork: bool = True
    """Fork kernel-queue's kernel from the launcher where it runs on the launcher's interpreter
    (``supervisor.fork_arguments``), instead of starting it as a new program."""


KERNEL_MODULE = ("-m", "kernel_queue.launcher.kernel")


def default_kernel_argv() -> tuple[str, ...]:
    """The IPython kernel of ``kernel_queue.launcher.kernel`` run by this interpreter."""
    return (sys.executable, *KERNEL_MODULE, "-f", CONNECTION_FILE_PLACEHOLDER)


def from_archive(argv: Sequence[str], where: str | None) -> tuple[str, ...]:
    """``argv`` with ``-m kernel_queue.launcher.kernel`` run from the archive at ``where``
    (``python ARCHIVE kernel …``): an image need not have kernel-queue installed. Unchanged
    when the launcher does not run from an archive (``where`` None)."""
    argv = tuple(argv)
    if where is None:
        return argv
    for index in range(len(argv) - 1):
        if argv[index : index + 2] == KERNEL_MODULE:
            return (*argv[:index], where, origin.KERNEL_COMMAND, *argv[index + 2 :])
    return argv


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> LaunchSettings:
    """Build settings from ``argv`` (options, then ``--`` and the kernel command) and ``environ``.

    Called by ``__main__``; raises ``contract.SettingsError`` for bad input. Unknown options make
    argparse exit with status 2 itself.
    """
    argv = list(argv)
    kernel_argv: tuple[str, ...] = ()
    if "--" in argv:
        split = argv.index("--")
        argv, kernel_argv = argv[:split], tuple(argv[split + 1 :])
    args: argparse.Namespace | SimpleNamespace = _parser().parse_args(argv) if argv else NO_OPTIONS

    def pick(value: str | None, env: str, default: str | None = None) -> str | None:
        return value if value is not None else environ.get(env, default)

    status_fd = _parse_status_fd(pick(args.status_fd, contract.ENV_STATUS_FD))
    parent_death = args.parent_death_signal or contract.parse_flag(
        environ.get(contract.ENV_PARENT_DEATH, ""),
        contract.ENV_PARENT_DEATH,
        "--parent-death-signal",
    )
    stop_timeout = contract.parse_seconds(
        pick(args.stop_timeout, contract.ENV_STOP_TIMEOUT),
        contract.ENV_STOP_TIMEOUT,
        contract.DEFAULT_BUDGET.stop_timeout,
        what="stop timeout",
        option="--stop-timeout",
    )
    if args.worker or _parse_mode(environ.get(contract.ENV_MODE, "")) == "worker":
        return LaunchSettings(
            ip="",
            ports=NO_PORTS,
            key="",
            transport="tcp",
            signature_scheme=DEFAULT_SIGNATURE_SCHEME,
            kernel_argv=kernel_argv,
            status_fd=status_fd,
            parent_death=parent_death,
            stop_timeout=stop_timeout,
            worker=True,
        )
    return LaunchSettings(
        ip=pick(args.ip, contract.ENV_IP, "127.0.0.1") or "127.0.0.1",
        ports=_parse_ports(pick(args.ports, contract.ENV_PORTS)),
        key=_read_key(pick(args.key_file, contract.ENV_KEY_FILE), environ.get(contract.ENV_KEY)),
        transport=_parse_transport(pick(args.transport, contract.ENV_TRANSPORT, "tcp")),
        signature_scheme=_parse_signature_scheme(
            pick(args.signature_scheme, contract.ENV_SIGNATURE_SCHEME, DEFAULT_SIGNATURE_SCHEME)
        ),
        kernel_argv=from_archive(kernel_argv or default_kernel_argv(), origin.path()),
        status_fd=status_fd,
        parent_death=parent_death,
        stop_timeout=stop_timeout,
        # Parsed here too, so a bad checkpoint input stops the launcher before any kernel runs.
        checkpointing=contract.parse_checkpointing(environ) is not None,
        termination_log=_termination_log(pick(args.termination_log, contract.ENV_TERMINATION_LOG)),
        fork=contract.parse_flag(environ.get(contract.ENV_FORK) or "1", contract.ENV_FORK),
    )


def _parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m kernel_queue.launcher",
        description="Own one Jupyter kernel: connection file, signals, in-place restarts.",
        epilog="Each option falls back to the KERNEL_QUEUE_LAUNCH_* variable named in its help. "
        "The kernel command follows '--'.",
    )
    parser.add_argument("--ip", help=f"address to bind (${contract.ENV_IP}, default 127.0.0.1)")
    parser.add_argument(
        "--ports", help=f"shell,iopub,stdin,control,hb ports (${contract.ENV_PORTS}, required)"
    )
    parser.add_argument(
        "--key-file",
        help=f"file holding the HMAC key (${contract.ENV_KEY_FILE}; else ${contract.ENV_KEY})",
    )
    parser.add_argument("--transport", help=f"tcp or ipc (${contract.ENV_TRANSPORT}, default tcp)")
    parser.add_argument(
        "--signature-scheme",
        help=f"message signing (${contract.ENV_SIGNATURE_SCHEME}, default hmac-sha256)",
    )
    parser.add_argument(
        "--status-fd", help=f"inherited fd for JSON status lines (${contract.ENV_STATUS_FD})"
    )
    parser.add_argument(
        "--parent-death-signal",
        action="store_true",
        help=f"stop when the parent process dies, Linux only (${contract.ENV_PARENT_DEATH}=1)",
    )
    parser.add_argument(
        "--stop-timeout",
        help=f"seconds between SIGTERM and SIGKILL of the kernel (${contract.ENV_STOP_TIMEOUT}, "
        f"default {contract.DEFAULT_BUDGET.stop_timeout:g})",
    )
    parser.add_argument(
        "--termination-log",
        help=f"file for the checkpoint sentence after SIGTERM (${contract.ENV_TERMINATION_LOG}; "
        f"default {contract.DEFAULT_TERMINATION_LOG} if writable)",
    )
    parser.add_argument(
        "--worker",
        action="store_true",
        help=f"run as a worker pod of a group: no kernel, ports or key; run the command after "
        f"'--' (if any) and wait for SIGTERM "
        f"(${contract.ENV_MODE}=worker)",
    )
    return parser


NO_OPTIONS = SimpleNamespace(
    ip=None,
    ports=None,
    key_file=None,
    transport=None,
    signature_scheme=None,
    status_fd=None,
    parent_death_signal=False,
    stop_timeout=None,
    termination_log=None,
    worker=False,
)
"""What ``_parser()`` makes of no options, without importing argparse."""


def _parse_mode(raw: str) -> str:
    mode = raw.strip().lower() or "kernel"
    if mode not in MODES:
        raise contract.SettingsError(
            f"invalid launch mode {raw!r}: set {contract.ENV_MODE} to kernel or worker, or pass "
            "--worker"
        )
    return mode


def _parse_ports(raw: str | None) -> tuple[int, int, int, int, int]:
    where = f"--ports or {contract.ENV_PORTS}"
    if not raw:
        raise contract.SettingsError(
            f"no kernel ports given: set {where} to five comma-separated ports"
        )
    try:
        ports = tuple(int(part) for part in raw.split(","))
    except ValueError:
        ports = ()
    if len(ports) != len(PORT_NAMES) or not all(0 < port < 65536 for port in ports):
        raise contract.SettingsError(
            f"invalid kernel ports {raw!r}: set {where} to five comma-separated ports "
            f"({','.join(PORT_NAMES)}), each 1-65535"
        )
    shell, iopub, stdin, control, hb = ports
    return shell, iopub, stdin, control, hb


def _read_key(key_file: str | None, key: str | None) -> str:
    if key_file:
        try:
            with open(key_file, encoding="utf-8") as file:
                key = file.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise contract.SettingsError(
                f"cannot read the key file {key_file!r} ({exc.__class__.__name__}): fix "
                f"--key-file or {contract.ENV_KEY_FILE}"
            ) from exc
        if not key:
            raise contract.SettingsError(
                f"the key file {key_file!r} is empty: fix --key-file or {contract.ENV_KEY_FILE}"
            )
        return key
    if not key:
        raise contract.SettingsError(
            f"no connection key: set {contract.ENV_KEY}, or pass --key-file or set "
            f"{contract.ENV_KEY_FILE}"
        )
    return key


def _parse_transport(raw: str | None) -> str:
    if raw not in TRANSPORTS:
        raise contract.SettingsError(
            f"invalid transport {raw!r}: set --transport or {contract.ENV_TRANSPORT} to tcp or ipc"
        )
    return raw


def _parse_signature_scheme(raw: str | None) -> str:
    raw = raw or ""
    algorithm = raw.removeprefix("hmac-")
    if algorithm == raw or (raw != DEFAULT_SIGNATURE_SCHEME and not _hash_available(algorithm)):
        raise contract.SettingsError(
            f"invalid signature scheme {raw!r}: set --signature-scheme or "
            f"{contract.ENV_SIGNATURE_SCHEME} to hmac-<hash>, e.g. hmac-sha256"
        )
    return raw


def _hash_available(algorithm: str) -> bool:
    import hashlib  # loads OpenSSL: only for a scheme other than the default (sha256, always there)

    return algorithm in hashlib.algorithms_available


def _parse_status_fd(raw: str | None) -> int | None:
    if not raw:
        return None
    try:
        fd = int(raw)
        os.fstat(fd)
    except (ValueError, OSError) as exc:
        raise contract.SettingsError(
            f"invalid status fd {raw!r} (not an open file descriptor): pass an inherited, open "
            f"descriptor in --status-fd or {contract.ENV_STATUS_FD}"
        ) from exc
    return fd


def _termination_log(raw: str | None) -> str | None:
    if raw:
        return raw
    default = contract.DEFAULT_TERMINATION_LOG
    return default if os.path.isfile(default) and os.access(default, os.W_OK) else None
