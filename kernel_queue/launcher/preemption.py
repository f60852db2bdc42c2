"""The kernel side of preemption: on SIGTERM tell the notebook, save within the budget, exit 143.

`Preemption` is made by `checkpointing.prepare` (which restores the state first) and armed by
``kernel.py`` once the kernel is initialized (`install`): SIGTERM raises `Preempted` in a running
cell, or saves at the next cell boundary, or, if none comes within ``contract``'s time budget,
saves while the cell runs; the sentence of what was saved goes to the notebook and to the
launcher's report, and the kernel leaves its loops with status 143 (never 0, which would let
Kueue finish the pod group instead of requeueing it). A shutdown request never saves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from IPython.core.interactiveshell import InteractiveShell

from kernel_queue import checkpoint, launcher
from kernel_queue.launcher import contract, kernel_log

if TYPE_CHECKING:
    from kernel_queue.launcher.continuous import Continuous

NOTICE = "Kernel stopping to give back its GPUs (preempted, or parked while idle); saving state…"
"""The stream message a user sees as soon as the kernel gets SIGTERM with no word of why (a pod's
SIGTERM: a preemption and a park look alike; the kernel's status item says which)."""
NOTED = "Kernel stopping to give back its GPUs ({why}); saving state…"
"""The same where the backend said why (``contract.ENV_STOP_NOTE``: the local backend does)."""
REPLY_DELAY, WIRE_DELAY = 0.1, 0.2
"""Seconds for the interrupted cell's reply to leave the shell-channel thread before the loop
stops; and for ZeroMQ to send the last IOPub messages before ``os._exit``."""
_RUN_CODE = InteractiveShell.run_code.__code__


class Preempted(BaseException):
    """Raised in the running cell when the kernel is preempted, so the cell unwinds visibly."""


def log(message: str) -> None:
    """One line in the kernel's log (the launcher's log, never the notebook)."""
    kernel_log.write(f"[kernel-queue checkpoint] {message}")


class Options(Protocol):
    """What a preemption reads of the kernel's checkpoint inputs (`checkpointing.Options`)."""

    @property
    def deadline(self) -> float:
        """Seconds after SIGTERM the save may take."""
        ...

    @property
    def keep(self) -> bool:
        """Keep the checkpoints after a final shutdown (else it deletes them)."""
        ...

    @property
    def report(self) -> str | None:
        """Where the kernel writes its report for the launcher; None: nowhere."""
        ...

    @property
    def generation(self) -> int:
        """0 for the launcher's first kernel, one more per in-place restart (only 0 restores)."""
        ...

    @property
    def continuous(self) -> bool:
        """Also checkpoint after each cell (``continuous``), so SIGTERM flushes only the rest."""
        ...


class Preemption:
    """Saves the kernel's namespace once on SIGTERM and ends the kernel with status 143."""

    def __init__(
        self,
        options: Options,
        store: checkpoint.DirectoryStore,
        module: types.ModuleType,
        restore_summary: str | None,
    ) -> None:
        self.options, self.store, self.module = options, store, module
        self.exit_status: int | None = None
        """143 once the kernel should leave its loops after a save; read by ``kernel.main``."""
        self._restore_summary = restore_summary
        # What the checkpoint put into the module, before IPython adds its own names to it.
        self._restored = {k: v for k, v in vars(module).items() if not k.startswith("__")}
        self._kernel: Any = None
        self._pid = os.getpid()
        self._lock = threading.RLock()  # the SIGTERM handler may run while the main thread holds it
        self._parent: dict[str, Any] | None = None  # the main shell's running execute_request
        self._noticed: float | None = None  # monotonic time SIGTERM was noticed
        self._deadline = 0.0
        self._notice_parent: dict[str, Any] | None = None
        self._closing = self._raised = False
        self._save_started, self._save_done = threading.Event(), threading.Event()
        self.continuous: Continuous | None = None
        """The background saves after each cell, once ``install`` armed them."""
        self.restored: checkpoint.Checkpoint | None = None
        """The checkpoint restored, marked so at the first request (``prepare``)."""

    @property
    def kernel(self) -> Any:  # the kernel ``install`` armed
        return self._kernel

    def stopping(self) -> bool:  # SIGTERM or a shutdown_request came: no continuous saves
        return self._noticed is not None or self._closing

    def publish(self, text: str) -> None:  # a stderr stream message, under the running request
        self._publish(text, self._parent)

    def install(self, kernel: Any) -> None:
        """Arm SIGTERM; call on the main thread after ``IPKernelApp.initialize``."""
        self._kernel = kernel
        self._unhide_restored(kernel.shell)
        kernel.shell.events.register("post_run_cell", self._post_run_cell)
        kernel.shell.set_custom_exc((Preempted,), _show_preempted)
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        # The wakeup fd tells a thread about SIGTERM even while the main thread is stuck in C.
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        args = (read_fd, previous)
        threading.Thread(target=self._watch, args=args, name="preempt-watch", daemon=True).start()
        os.register_at_fork(after_in_child=_disarm)
        if self.options.continuous:
            from kernel_queue.launcher.continuous import Continuous

            self.continuous = Continuous(self)
            self.continuous.install(kernel)

    def load(self) -> None:
        """Import what saving needs (`checkpoint.load`), which the start left out where there
        was nothing to restore; a failure is logged, and the save meets it again."""
        try:
            checkpoint.load()
        except Exception as exc:
            log(f"the checkpoint library did not load: {exc!r}")

    def _unhide_restored(self, shell: Any) -> None:
        """Make the restored names the user's again. IPython hides every name the user module
        holds when the kernel starts (`hide_initial_ns`), so `%who` would not list them and the
        next save, which skips hidden names, would drop them."""
        for name, value in self._restored.items():
            if shell.user_ns.get(name) is value:  # not one IPython itself set (In, Out, exit…)
                shell.user_ns_hidden.pop(name, None)

    def before_execute(self, parent: dict[str, Any]) -> None:
        """Track the main shell's request; show the restore summary on the first visible one.

        ``kernel.py`` calls this once IOPub has a subscriber (not at start: nobody would see it).
        """
        if threading.current_thread() is threading.main_thread():
            self._parent = parent
        if self.continuous is not None:
            self.continuous.ran()  # silent requests run code too, and no cell event says so
        if self.restored is not None:  # the state diverges from it now
            with contextlib.suppress(OSError):
                self.store.mark_restored(self.restored)
            self.restored = None
        text, silent = self._restore_summary, parent.get("content", {}).get("silent")
        if text is not None and not silent:
            self._restore_summary = None
            self._publish(text, parent)

    def after_execute(self) -> None:
        """After the reply: a preempted kernel that has saved leaves its loops."""
        if threading.current_thread() is not threading.main_thread():
            return
        expressions = (self._parent or {}).get("content", {}).get("user_expressions")
        self._parent = None
        if self.continuous is not None and expressions:
            self.continuous.ran()  # they ran after the cell's snapshot
        if self._noticed is not None:
            self._save("cell", "consistent")  # post_run_cell may not have run
            if self._save_done.is_set():
                self._kernel.io_loop.call_later(REPLY_DELAY, self._exit_cleanly)

    def on_shutdown(self, restart: bool) -> None:
        """A shutdown_request: never save from now on; a final one deletes the store (not KEEP)."""
        with self._lock:
            if self._noticed is not None:
                return  # preempted first: the save wins
            self._closing = True
        if self.continuous is not None:
            self.continuous.stop()
        if restart:  # the user asked for a fresh kernel: a later relaunch must not roll back
            with contextlib.suppress(Exception):
                newest = self.store.latest()
                if newest is not None:
                    self.store.mark_restored(newest)
        if not (restart or self.options.keep):
            try:
                self.store.delete_all()
            except Exception as exc:
                log(f"could not delete the checkpoints: {exc!r}")

    def _on_sigterm(self, signum: int, frame: types.FrameType | None) -> None:
        """Main thread: raise ``Preempted`` in a running cell, else save on the event loop."""
        if os.getpid() != self._pid:  # a forked child raced its at-fork reset
            _disarm()
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self._closing:
            os._exit(launcher.PREEMPTED_EXIT_CODE)
        self._preempt()
        if _in_cell_code(frame):
            if not self._raised:
                self._raised = True
                raise Preempted("the kernel was preempted by a higher-priority workload")
            return
        try:
            asyncio.get_running_loop().call_soon_threadsafe(self._save_at_boundary)
        except RuntimeError:  # not started yet, or already stopped: no loop to leave
            self._save("idle", "consistent")
            self._hard_exit()

    def _watch(self, read_fd: int, previous_fd: int) -> None:
        """Thread: read SIGTERM's byte from the wakeup fd (also while the main thread is stuck)."""
        while data := os.read(read_fd, 512):
            if previous_fd >= 0:
                with contextlib.suppress(OSError):
                    os.write(previous_fd, data)
            if signal.SIGTERM in data:
                self._preempt()

    def _preempt(self) -> None:
        """Once: tell the notebook, start the clock and the guard thread."""
        with self._lock:
            if self._noticed is not None or self._closing:
                return
            self._noticed = time.monotonic()
            self._deadline = self._noticed + self.options.deadline
            self._notice_parent = self._parent
        log(f"SIGTERM: saving within {self.options.deadline:g} s")
        why = contract.read_stop_note(os.environ)
        self._publish(NOTED.format(why=why) if why else NOTICE, self._notice_parent)
        threading.Thread(target=self._guard, name="preempt-guard", daemon=True).start()

    def _guard(self) -> None:
        """Thread: save concurrently if no cell boundary came in time; always end the process."""
        delay = contract.cell_wait(self.options.deadline)
        if not self._save_started.wait(delay):
            log(f"no cell boundary within {delay:g} s; saving while the cell runs")
            if self._save("concurrent", "concurrent"):
                self._hard_exit()
        abandon = self._deadline + contract.SAVE_SLACK_SECONDS
        if not self._save_done.wait(max(0.0, abandon - time.monotonic())):
            seconds = time.monotonic() - (self._noticed or 0.0)
            record = _failure("the save did not end in time", "", seconds)
            self._publish(record["summary"], self._notice_parent)
            self._write_report(record)
            self._hard_exit()
        time.sleep(contract.PREEMPTED_EXIT_SECONDS)  # the main thread exits cleanly first
        self._hard_exit()

    def _post_run_cell(self, result: Any) -> None:
        if self._noticed is not None and threading.current_thread() is threading.main_thread():
            self._save("cell", "consistent")

    def _save_at_boundary(self) -> None:
        """Main thread, between requests (or in an awaiting cell): save, then leave the loops."""
        self._save("idle", "consistent")
        if self._save_done.is_set() and self._parent is None:
            self._exit_cleanly()

    def _save(self, trigger: str, consistency: str) -> bool:
        """Run the one save, publish its sentence and write the report; False if it began before."""
        with self._lock:
            if self._save_started.is_set():
                return False
            self._save_started.set()
        delay = time.monotonic() - (self._noticed or time.monotonic())
        started, waited = time.monotonic(), 0.0
        try:
            if self.continuous is not None:  # a save in flight commits first: the base
                self.continuous.settle(self._deadline)
            waited = time.monotonic() - started
            committed = self.store.committed()
            known = self.continuous.trusted() if self.continuous is not None else {}
            history = None
            if self.continuous is not None and consistency == "consistent":
                history = self.continuous.history()  # which arrays a cell changed since
            if history is not None and (not committed or committed[-1].id != history.base.id):
                history = None
            report = checkpoint.save(
                self.module,
                self.store,
                hidden=set(list(self._kernel.shell.user_ns_hidden)),  # In, Out, exit…
                deadline=self._deadline,
                consistency=consistency,
                extra={"trigger": trigger, "generation": self.options.generation},
                base=committed[-1] if committed else None,
                known=known,
                history=history,
            )
            record = _record(report)
        except Exception as exc:  # the kernel must exit 143 whatever the save did
            log(f"save failed: {exc!r}")
            record = _failure(f"{type(exc).__name__}: {exc}", consistency)
        record.update(trigger=trigger, delay=round(delay, 3), waited=round(waited, 3))
        log(f"{trigger} save: {record['summary']}")
        _flush_std()  # the cell's own output (and its error) first
        self._publish(record["summary"], self._notice_parent)
        self._write_report(record)
        self._save_done.set()
        return True

    def _publish(self, text: str, parent: dict[str, Any] | None) -> None:
        """A stderr stream message, parented to ``parent`` (None: to no request)."""
        kernel = self._kernel
        topic = getattr(kernel, "_topic", None)
        try:
            kernel.session.send(
                kernel.iopub_socket,
                "stream",
                {"name": "stderr", "text": text.rstrip("\n") + "\n"},
                parent=parent,
                ident=topic("stream") if topic else None,
            )
        except Exception as exc:
            log(f"could not publish on IOPub: {exc!r}")

    def _write_report(self, record: Mapping[str, Any]) -> None:
        """Write the JSON report for the launcher atomically (0600); absent path: skip."""
        path = self.options.report
        if not path:
            return
        tmp = f"{path}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "w", encoding="utf-8") as file:
                json.dump(record, file)
            os.replace(tmp, path)
        except OSError as exc:
            log(f"could not write the report {path}: {exc!r}")

    def _exit_cleanly(self) -> None:
        """Main thread: stop the main loop; ``kernel.main`` returns 143 and ipykernel's atexit
        ``close()`` stops its threads and flushes the sockets (what a plain return does)."""
        if self.exit_status is None:
            self.exit_status = launcher.PREEMPTED_EXIT_CODE
            self._kernel.io_loop.add_callback(self._kernel.io_loop.stop)

    def _hard_exit(self) -> None:
        """Any thread: flush what can be flushed, then end the process with 143 at once."""
        _flush_std()
        pub_thread = getattr(self._kernel, "iopub_thread", None)
        if pub_thread is not None:
            flushed = threading.Event()
            pub_thread.schedule(flushed.set)
            flushed.wait(1.0)
        time.sleep(WIRE_DELAY)
        os._exit(launcher.PREEMPTED_EXIT_CODE)


def _in_cell_code(frame: types.FrameType | None) -> bool:
    """Whether the interrupted main-thread frame runs a cell's own code (under ``run_code``)."""
    child = None
    while frame is not None:
        if frame.f_code is _RUN_CODE:
            return child is not None and child.f_code.co_name == "<module>"
        child, frame = frame, frame.f_back
    return False


def _show_preempted(
    shell: Any, etype: type[BaseException], value: BaseException, tb: Any, tb_offset: Any = None
) -> list[str]:
    """IPython's custom handler for ``Preempted``: one line, not a traceback into the handler."""
    stb = [f"{etype.__name__}: {value}; its variables are being saved"]
    shell._showtraceback(etype, value, stb)  # ipykernel publishes it as the cell's error
    return stb


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _disarm() -> None:
    """In a forked child: SIGTERM kills it as usual and reaches no parent's watcher."""
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)


def _record(report: checkpoint.SaveReport) -> dict[str, Any]:
    """The launcher's JSON view of a ``SaveReport``, with the sentence users read."""
    cp = report.checkpoint
    return {
        "checkpoint": None if cp is None else cp.id,
        "path": None if cp is None else str(cp.path),
        "consistency": report.consistency,
        "saved": [{"name": name, "bytes": size} for name, size in report.saved],
        "skipped": [{"name": n, "type": t, "reason": r} for n, t, r in report.skipped],
        "bytes": report.bytes,
        "seconds": round(report.seconds, 3),
        "error": report.error,
        "summary": checkpoint.summary(report),
    }


def _failure(error: str, consistency: str, seconds: float = 0.0) -> dict[str, Any]:
    """The record of a save that committed nothing and returned no ``SaveReport``."""
    return _record(checkpoint.SaveReport(None, (), (), 0, seconds, consistency, error))
