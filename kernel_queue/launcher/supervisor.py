"""The supervisor loop: owns the connection file, the kernel child and the launcher's signals.

It starts the kernel in its own session (kernel-queue's kernel on this interpreter as a fork of
the launcher, which spares it Python's start and the imports done here; any other command as a
new program), forwards signals, restarts the kernel in place (same connection file) on exit
status 75 or SIGHUP, and otherwise exits with the kernel's status; after SIGTERM it always
exits 143 and passes on the kernel's checkpoint report. Signals arrive through
``signal.set_wakeup_fd`` and a selector, so nothing sleeps or polls; worker-mode settings hand over
to ``worker.run``. Stdlib only, and of it only what the kernel's start needs (paths are
strings: ``pathlib`` would cost the start ~5 ms).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

from kernel_queue import launcher
from kernel_queue.launcher import contract, origin, worker
from kernel_queue.launcher import settings as launch_settings

LOG_PREFIX = "[kernel-queue launcher] "
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HANDLED_SIGNALS = (*FORWARDED_SIGNALS, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)
RESTART_KILL_TIMEOUT = 5.0
"""Seconds a kernel restarted by SIGHUP gets between SIGHUP and SIGKILL.

It gets SIGHUP, not SIGTERM: to a checkpointing kernel SIGTERM means "preempted, save"."""
REAP_TIMEOUT = 5.0
"""Seconds to wait for a SIGKILLed kernel to be reaped while the launcher exits."""
START_FAILED_EXIT_CODE = 127
"""Exit status when the kernel command cannot be executed (as a shell reports it)."""
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
REPORT_FILE = "checkpoint-report.json"
"""Name, in the launcher's private directory, of the file a preempted kernel reports into."""
REPORT_LIMIT = 1 << 20
TERMINATION_LOG_LIMIT = 4096
"""Bytes Kubernetes keeps of a termination message."""


def log(message: str) -> None:
    """Write one launcher line to stderr (the kernel's own output goes to the inherited streams)."""
    print(f"{LOG_PREFIX}{message}", file=sys.stderr, flush=True)


def set_parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent dies; False where unsupported.

    Safe to call in a forked child before exec (``preexec_fn``): libc is loaded by the parent.
    """
    if _prctl is None:
        return False
    args = (ctypes.c_ulong(value) for value in (signum, 0, 0, 0))
    return int(_prctl(ctypes.c_int(PR_SET_PDEATHSIG), *args)) == 0


def _load_prctl() -> Callable[..., Any] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., Any] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_prctl = _load_prctl()


def write_connection_file(directory: str, config: launch_settings.LaunchSettings) -> str:
    """Write the kernel's connection file (mode 0600) into ``directory`` and return its path."""
    shell, iopub, stdin, control, hb = config.ports
    info = {
        "shell_port": shell,
        "iopub_port": iopub,
        "stdin_port": stdin,
        "control_port": control,
        "hb_port": hb,
        "ip": config.ip,
        "key": config.key,
        "transport": config.transport,
        "signature_scheme": config.signature_scheme,
        "kernel_name": "",
    }
    path = os.path.join(directory, "kernel.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w", encoding="utf-8") as file:
        json.dump(info, file, indent=1)
    return path


def exit_status(wait_status: int) -> int:
    """A wait status as a shell would report it: the exit code, or 128 + the killing signal."""
    return launcher.shell_status(os.waitstatus_to_exitcode(wait_status))


class Supervisor:
    """Runs one kernel at a time until it ends for good; ``run()`` returns the launcher's status."""

    def __init__(self, config: launch_settings.LaunchSettings) -> None:
        self.config = config
        self.generation = -1
        self.child: subprocess.Popen[bytes] | Forked | None = None
        self._argv: list[str] = []
        self._fork: list[str] | None = None
        """The kernel's own arguments where it is forked (`fork_arguments`), else None."""
        self._in_kernel = False
        """True in a forked kernel: the launcher's clean-up is not its to run."""
        self._wakeup: _Wakeup | None = None
        self._env = {
            name: value
            for name, value in os.environ.items()
            if name not in (contract.ENV_KEY, contract.ENV_KEY_FILE)
        }
        self._stopping = False
        self._restarting = False
        self._deadline: float | None = None
        self._status_broken = False
        self._report: str | None = None
        if config.status_fd is not None:
            os.set_inheritable(config.status_fd, False)

    def run(self) -> int:
        """Start and supervise the kernel; on exit, remove the kernel and the connection file.

        In worker mode there is no kernel: run the worker command (``kernel_argv``, if any), wait
        for SIGTERM or SIGINT, stop the command and return 143.
        """
        if self.config.worker:
            return worker.run(
                log, command=self.config.kernel_argv, stop_timeout=self.config.stop_timeout
            )
        with self._signals() as wakeup:
            workdir = tempfile.mkdtemp(prefix="kernel-queue-")
            try:
                connection_file = write_connection_file(workdir, self.config)
                self._report = os.path.join(workdir, REPORT_FILE)
                self._argv = [
                    arg.replace(launch_settings.CONNECTION_FILE_PLACEHOLDER, connection_file)
                    for arg in self.config.kernel_argv
                ]
                if self.config.fork:
                    self._fork = fork_arguments(self._argv, self._env.get("PATH"))
                return self._supervise(wakeup)
            finally:
                if not self._in_kernel:  # a forked kernel leaves through here: nothing to undo
                    self._kill_child(wakeup)
                    shutil.rmtree(workdir, ignore_errors=True)

    def _supervise(self, wakeup: selectors.BaseSelector) -> int:
        if not self._start_child():
            return START_FAILED_EXIT_CODE
        while True:
            timeout = (
                None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            )
            for signum in self._wait(wakeup, timeout):
                self._on_signal(signum)
            if self._deadline is not None and time.monotonic() >= self._deadline:
                log("the kernel did not exit in time; sending SIGKILL")
                self._signal_group(signal.SIGKILL)
                self._deadline = None
            status = self._reap()
            if status is None:
                continue
            restart = not self._stopping and (
                self._restarting or status == launcher.RESTART_EXIT_CODE
            )
            self._emit(event="exited", generation=self.generation, status=status, restart=restart)
            self._pass_on_report(status)
            self._signal_group(signal.SIGKILL)  # whatever the old kernel left in its group
            self._restarting, self._deadline, self.child = False, None, None
            if self._stopping:
                return launcher.PREEMPTED_EXIT_CODE
            if not restart:
                log(f"the kernel exited with status {status}")
                return status
            log(f"restarting the kernel in place (it exited with status {status})")
            if not self._start_child():
                return START_FAILED_EXIT_CODE

    def _start_child(self) -> bool:
        env = dict(self._env)
        env[contract.ENV_GENERATION] = str(self.generation + 1)
        if self._report is not None:
            env[contract.ENV_CHECKPOINT_REPORT] = self._report
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._report)
        child = self._fork_kernel(env) if self._fork is not None else self._exec_kernel(env)
        if child is None:
            return False
        self.child = child
        self.generation += 1
        self._emit(event="started", generation=self.generation, pid=child.pid)
        return True

    def _exec_kernel(self, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        """Start the kernel command as a new program, in its own session."""
        parent = os.getpid()

        def before_exec() -> None:  # runs in the child, after setsid
            set_parent_death_signal(signal.SIGKILL)
            if os.getppid() != parent:  # the launcher died before prctl took effect
                os._exit(1)

        try:
            return subprocess.Popen(
                self._argv, env=env, start_new_session=True, preexec_fn=before_exec
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log(f"cannot start the kernel {self._argv[0]!r}: {exc}")
            return None

    def _fork_kernel(self, env: dict[str, str]) -> Forked | None:
        """Start kernel-queue's kernel in a fork of this launcher: it skips Python's start and
        the imports the launcher has done (~60 ms of a kernel's start). The child leaves as the
        program it became would: through the launcher's frames, which it does not clean up."""
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        # The launcher signals the kernel as soon as it has its pid; until the child has put
        # the signals' defaults back, the launcher's handlers would only wake the launcher's
        # pipe, and the kernel would run on. Held (blocked) across the fork, a signal waits
        # for the disposition an exec would have given.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        try:
            pid = os.fork()
        except OSError as exc:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            log(f"cannot start the kernel: fork failed ({exc})")
            return None
        if pid:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            return Forked(pid)
        self._in_kernel = True
        try:
            os.setsid()
            set_parent_death_signal(signal.SIGKILL)
            if os.getppid() != parent:  # the launcher died before prctl took effect
                os._exit(1)
            self._release()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # an exec keeps the mask
        except BaseException:  # nothing of the kernel has run: end as a failed exec would
            os._exit(START_FAILED_EXIT_CODE)
        os.environ.clear()
        os.environ.update(env)
        arguments = self._fork or []
        from kernel_queue.launcher import kernel

        program = kernel.__file__ if self._argv[1] == "-m" else self._argv[1]
        sys.argv = [program or self._argv[1], *arguments]  # as the kernel's own start sets it
        raise SystemExit(kernel.main(arguments))

    def _release(self) -> None:
        """In a forked kernel: what an exec would have given it. Every signal the launcher
        catches back at its default (SIGINT at Python's), and of the launcher's files only the
        standard streams (its wakeup pipe and selector, its status stream and what it
        inherited are closed, as ``close_fds`` would)."""
        self._status_broken = True
        if self._wakeup is not None:
            self._wakeup.close()
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGTERM and not self._stopping:
            log("SIGTERM: stopping the kernel")
            self._stopping = True
            self._emit(event="stopping", signal=signum)
            self._signal_child(signal.SIGTERM)
            self._deadline = time.monotonic() + self.config.stop_timeout
        elif signum == signal.SIGHUP and not (self._stopping or self._restarting):
            log("SIGHUP: restarting the kernel in place")
            self._restarting = True
            self._signal_child(signal.SIGHUP)
            self._deadline = time.monotonic() + RESTART_KILL_TIMEOUT
        elif signum in FORWARDED_SIGNALS:
            self._signal_child(signum)

    def _pass_on_report(self, status: int) -> None:
        """Emit the kernel's checkpoint report; after SIGTERM, also as the termination message."""
        report = _read_report(self._report)
        if report is None and self._stopping and self.config.checkpointing:
            why = "was killed" if status == 128 + signal.SIGKILL else f"exited with status {status}"
            report = {
                "checkpoint": None,
                "error": f"the kernel {why} without reporting a checkpoint",
                "summary": f"checkpoint not saved: the kernel {why} before it finished saving; "
                "any earlier one is kept",
            }
        if report is None:
            return
        self._emit(event="checkpoint", **{k: v for k, v in report.items() if k != "event"})
        sentence = report.get("summary")
        if self._stopping and isinstance(sentence, str) and self.config.termination_log:
            data = sentence.encode()[:TERMINATION_LOG_LIMIT]
            try:
                with open(self.config.termination_log, "wb") as file:
                    file.write(data)
            except OSError as exc:
                log(f"cannot write the termination log {self.config.termination_log} ({exc})")

    def _signal_child(self, signum: int) -> None:
        if self.child is not None and self.child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.pid, signum)

    def _signal_group(self, signum: int) -> None:
        # The kernel leads its own session and cannot leave its process group, so the group id
        # stays its pid; it stays reserved while any member lives, even after the kernel is reaped.
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signum)

    def _reap(self) -> int | None:
        """Reap every exited child (as PID 1 that includes orphans); the kernel's status or None."""
        status = None
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return status
            if pid == 0:
                return status
            if self.child is not None and pid == self.child.pid:
                status = exit_status(wait_status)
                self.child.returncode = status  # reaped here, not by Popen.wait()

    def _kill_child(self, wakeup: selectors.BaseSelector) -> None:
        """Leave nothing behind: SIGKILL the kernel's group and wait (bounded) for the kernel."""
        if self.child is None:
            return
        self._signal_group(signal.SIGKILL)
        deadline = time.monotonic() + REAP_TIMEOUT
        while self.child.returncode is None and self._reap() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log(f"the kernel (pid {self.child.pid}) was not reaped after SIGKILL")
                return
            self._wait(wakeup, remaining)

    @staticmethod
    def _wait(wakeup: selectors.BaseSelector, timeout: float | None) -> list[int]:
        """Block until a signal arrives or ``timeout`` passes; return the signals received."""
        signums: list[int] = []
        for key, _ in wakeup.select(timeout):
            with contextlib.suppress(BlockingIOError):
                signums.extend(os.read(key.fd, 512))
        return signums

    def _emit(self, **event: Any) -> None:
        if self.config.status_fd is None or self._status_broken:
            return
        line = (json.dumps(event) + "\n").encode()
        try:
            os.write(self.config.status_fd, line)  # one write per line: the reader sees whole lines
        except OSError as exc:
            self._status_broken = True
            log(f"cannot write to the status fd {self.config.status_fd} ({exc}); no more events")

    @contextlib.contextmanager
    def _signals(self) -> Iterator[selectors.BaseSelector]:
        """Install handlers whose only job is to wake the selector; restore everything after."""
        self._wakeup = _Wakeup()
        try:
            yield self._wakeup.selector
        finally:
            if not self._in_kernel:  # a forked kernel closed its copy before it began
                self._wakeup.close()


class Forked:
    """A kernel forked from this launcher: its pid and, once reaped, its status (what the
    supervisor reads of a ``subprocess.Popen``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None


class _Wakeup:
    """The launcher's signal handlers, which only wake its selector through a pipe, and what
    they replaced; ``close`` puts those back and closes the pipe and the selector."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.read_fd, selectors.EVENT_READ)
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.previous = {signum: signal.signal(signum, _wake) for signum in HANDLED_SIGNALS}

    def close(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self.previous_fd)
        self.selector.close()
        os.close(self.read_fd)
        os.close(self.write_fd)


def fork_arguments(
    argv: Sequence[str], search_path: str | None, launcher_argv: Sequence[str] | None = None
) -> list[str] | None:
    """The kernel's own arguments where ``argv`` runs kernel-queue's kernel on this very
    interpreter, with no options of its own (``python -m kernel_queue.launcher.kernel ARGS``, or
    ``python ARCHIVE kernel ARGS`` from the archive this launcher runs from), and the launcher
    itself was started without any either (``launcher_argv``, default ``sys.orig_argv``): such
    a kernel can be forked from the launcher and start as it would after an exec. None
    otherwise (``python -X dev -m kernel_queue.launcher`` would hand its options on)."""
    started = sys.orig_argv if launcher_argv is None else launcher_argv
    options = len(started) < 2 or (started[1].startswith("-") and started[1] != "-m")
    if len(argv) < 3 or options:
        return None
    program = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=search_path)
    if program is None or os.path.abspath(program) != os.path.abspath(sys.executable):
        return None
    if tuple(argv[1:3]) == launch_settings.KERNEL_MODULE:
        return list(argv[3:])
    archive = origin.path()
    if archive is not None and argv[1] == archive and argv[2] == origin.KERNEL_COMMAND:
        return list(argv[3:])
    return None


def _read_report(path: str | None) -> dict[str, Any] | None:
    """The JSON object a kernel left in ``path`` (then removed), or None."""
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            data = file.read(REPORT_LIMIT)
        os.unlink(path)
        report = json.loads(data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log(f"ignoring an unreadable checkpoint report ({exc})")
        return None
    return report if isinstance(report, dict) else None


def _wake(signum: int, frame: FrameType | None) -> None:
    """Python-level handler: the C handler already wrote ``signum`` to the wakeup fd."""
