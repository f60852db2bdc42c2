"""Continuous checkpoints: after each cell, a forked copy of the kernel saves what the cell changed.

At ``post_run_cell`` the kernel is at a cell boundary, so ``os.fork`` takes a consistent snapshot
of the namespace for the cost of copying the page tables (a few ms for GBs): the child, a frozen
copy-on-write image, writes an incremental checkpoint (``checkpoint.save`` with the newest
committed one as its base, so unchanged arrays are hard links) and ``os._exit``s, while the
parent runs the next cell at once (as Redis's BGSAVE). `page_writes` scans which pages were
written just before the fork and just after it (sent to the child through a pipe), so the child
reads no array no one wrote since its base checkpoint's fork and hashes no array it must write
anyway (where the kernel has no page tracking it hashes every array). One save runs at a time;
cells that end meanwhile make one more save once it ends. The child never touches ZeroMQ,
prints or takes the parent's locks: it resets its signals, writes to nothing but the store and
pipes, dies with the kernel (``PR_SET_PDEATHSIG``), yields the CPU (niceness 19) once the
user's code runs again and is killed after ``CHILD_TIMEOUT_SECONDS``; a child killed at any
moment leaves the previous checkpoint intact (the store's commit protocol). Where a GPU context
forbids fork (CUDA initialised by torch, cupy, jax), saves pause with one note.

On SIGTERM ``settle`` lets a save in flight finish (or kills it when the deadline nears); the
preemption's own save is then incremental too, and told by a last page scan which arrays changed.
``ACTIVITY`` records when the last cell ended, so a kernel restored after a kill without grace
can say which later cells were lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import select
import signal
import sys
import threading
import time
import types
import warnings
from collections.abc import Mapping
from typing import Any, Protocol

from kernel_queue import checkpoint
from kernel_queue.checkpoint import durable
from kernel_queue.launcher import kernel_log, page_writes
from kernel_queue.launcher.supervisor import set_parent_death_signal

TRIGGER = "continuous"
"""The manifest's ``trigger`` of a checkpoint taken after a cell (a SIGTERM save says why)."""
ACTIVITY = "activity.json"
"""In the store's root: the last cell that ended, and when (never a checkpoint's name)."""
CHILD_TIMEOUT_SECONDS = 600.0
"""A save child still running after this long is stuck: SIGKILLed, its partial checkpoint
dropped by the next save."""
CHILD_NICENESS = 19
"""Once the user's code runs again, the save child yields the CPU to it (at 19 a busy core
gives it ~1.5% beside the kernel's thread). Until then it has the kernel's own priority, so a
SIGTERM right after a cell waits for it at full speed; no process may raise its priority back."""
RESULT_LIMIT = 1 << 20
KERNEL_CODE = ("ipykernel", "IPython", "zmq", "tornado", "jupyter_client", "kernel_queue")
"""Modules whose threads and tasks run the kernel, not code of the user's."""
COMMS = ("comm_open", "comm_msg", "comm_close")
"""Shell messages that run the user's code (widget callbacks) outside a cell."""


class Generation(Protocol):
    @property
    def generation(self) -> int:
        """Which kernel process of the launch this is (1 for the first)."""
        ...


class Host(Protocol):
    """What the background saves need of the kernel's SIGTERM handler, which owns them
    (`preemption.Preemption`): the kernel, the store and namespace it saves, whether a stop has
    begun, and a way to tell the user."""

    @property
    def options(self) -> Generation:
        """The launch's options (the save's manifest records the generation)."""
        ...

    @property
    def store(self) -> checkpoint.DirectoryStore:
        """Where the checkpoints go."""
        ...

    @property
    def module(self) -> types.ModuleType:
        """The namespace saved: the kernel's ``__main__``."""
        ...

    @property
    def kernel(self) -> Any:
        """The kernel the handler armed."""
        ...

    def stopping(self) -> bool:
        """SIGTERM or a shutdown_request came: no more continuous saves."""
        ...

    def load(self) -> None:
        """Import what a save needs, if the kernel has not yet (`checkpoint.load`)."""
        ...

    def publish(self, text: str) -> None:
        """A stderr stream message to the user, under the running request."""
        ...


def fork_forbidden() -> str:
    """Why this process must not fork (a GPU runtime whose context a child cannot use), or ""."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    with contextlib.suppress(Exception):
        if cuda is not None and cuda.is_initialized():
            return "torch has initialised CUDA"
    if "cupy" in sys.modules:
        return "cupy is imported"
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None) or {}
    if any(name != "cpu" for name in backends):
        return "jax runs on an accelerator"
    return ""


class Continuous:
    """The kernel's background saves; ``install`` hooks them to the shell's cell events."""

    def __init__(self, preemption: Host) -> None:
        self.preemption = preemption
        self._lock = threading.Lock()
        self._child: int | None = None  # the save child in flight
        self._idle = threading.Event()  # set while no child is in flight
        self._idle.set()
        self._pending = False  # a cell ended while a save was in flight
        self._running = False  # a cell runs (between pre_run_cell and post_run_cell)
        self._stopped = False
        self._noted = False
        self._cell: int | None = None
        self._activity: tuple[int | None, float] | None = None
        self._activity_ready = threading.Event()
        self._activity_lock = threading.Lock()
        self._ran = 0  # bumped whenever the user's code may run (cells, requests, comms)
        self._forked_at = -1  # `_ran` when the child in flight forked
        self._yielded: int | None = None  # the child in flight once it was reniced
        self._trusted: tuple[int, dict[int, tuple[int, str]]] = (-1, {})
        self._pages: page_writes.PageWrites | None = None  # None: every save hashes
        self._base: page_writes.Base | None = None  # the last committed save, for the next
        self._snapshot = 0  # the page snapshot of the last fork
        self.saves = 0
        """Continuous checkpoints committed by this kernel process."""
        self.fork_ms = self.scan_ms = 0.0
        """How long the last fork, and the page scan before it, held the main thread (the
        cell's reply waits for them)."""
        self.last: dict[str, Any] | None = None
        """The last save child's record (``checkpoint``, ``cell``, ``summary``…)."""

    def install(self, kernel: Any) -> None:
        """Register on the shell's cell events; call on the main thread after ``Preemption``'s."""
        kernel.shell.events.register("pre_run_cell", self._pre_run_cell)
        kernel.shell.events.register("post_run_cell", self._post_run_cell)
        handlers = getattr(kernel, "shell_handlers", {})
        for name in COMMS:
            if callable(handlers.get(name)):
                handlers[name] = self._counting(handlers[name])
        self._pages, why = page_writes.PageWrites.open()
        if self._pages is None:
            kernel_log.write(f"[kernel-queue checkpoint] saves hash every array: {why}")
        threading.Thread(target=self._write_activity, name="kq-activity", daemon=True).start()

    def settle(self, deadline: float) -> None:
        """SIGTERM or shutdown: start no more saves; let the one in flight end until halfway to
        ``deadline`` (a ``time.monotonic()`` value), then kill it. Any thread."""
        with self._lock:
            self._stopped, self._pending = True, False
        wait = max(0.0, (deadline - time.monotonic()) / 2)
        if not self._idle.wait(wait):
            kernel_log.write(
                f"[kernel-queue checkpoint] killing a continuous save after {wait:g} s"
            )
            self._kill()
            self._idle.wait(5.0)

    def stop(self) -> None:
        """A shutdown: kill any save in flight, start none and write no more ``ACTIVITY``
        (the store may be deleted next)."""
        with self._lock:
            self._stopped, self._pending = True, False
        self._kill()
        self._idle.wait(5.0)
        with self._activity_lock:  # a write in progress ends first
            pass

    def ran(self) -> None:
        """The user's code may run (an execute_request, its user_expressions, a comm): the
        save in flight yields the CPU to it from now on."""
        self._ran += 1
        if self._child is not None and self._yielded != self._child:
            self._yield()

    def trusted(self) -> dict[int, tuple[int, str]]:
        """id -> (bytes, digest) of the arrays the last committed save wrote or linked, if no
        code can have changed them since its fork: no request, cell or comm message came, and
        no thread or task of the user's runs; else {} (the flush then hashes every array)."""
        ran, digests = self._trusted
        if ran != self._ran or not digests or _user_code_running(self.preemption.kernel):
            return {}
        return digests

    def history(self) -> page_writes.ArrayHistory | None:
        """For a save at a cell boundary now (the SIGTERM flush, after ``settle``): which arrays
        are unchanged or written since the last committed save; None when that is not known
        (no tracking, no such save). A thread writing during the save makes it racy with or
        without this, as any save with the user's threads running."""
        base, pages = self._base, self._pages
        if pages is None or base is None:
            return None
        return pages.snapshot().history(base)

    def _yield(self) -> None:
        """Renice every thread of the save child in flight to ``CHILD_NICENESS`` (Linux's
        niceness is per thread; threads started later inherit their creator's). Under the lock
        the reaping takes, and never once reaping began, so the pid is still the child's."""
        with self._lock:
            pid = self._child
            if pid is None or self._yielded == pid:
                return
            self._yielded = pid
            for _ in range(2):  # a thread started while the first pass ran
                with contextlib.suppress(OSError):
                    for task in os.listdir(f"/proc/{pid}/task"):
                        with contextlib.suppress(OSError):
                            os.setpriority(os.PRIO_PROCESS, int(task), CHILD_NICENESS)

    def _counting(self, handler: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.ran()
            return handler(*args, **kwargs)

        return counted

    def _pre_run_cell(self, info: Any) -> None:
        self._running = True
        self.ran()

    def _post_run_cell(self, result: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._running = False
        cell = getattr(result, "execution_count", None)
        self._cell = cell if isinstance(cell, int) else None
        self._activity = (self._cell, time.time())
        self._activity_ready.set()
        self._start()

    def _coalesced(self) -> None:
        """Main thread, on the event loop: the save that cells ending meanwhile asked for,
        unless a cell that ended since started one of its own (it saved the newer state)."""
        if not self._running and self._pending:
            self._start()

    def _start(self) -> None:
        """Main thread, at a cell boundary: fork the save child (or note it is pending)."""
        preemption = self.preemption
        if preemption.stopping():
            return
        # The save's library is imported here, never in the child: a module lock another thread
        # held at the fork would stay held in the child for ever (a cell ending before the
        # kernel's delayed load pays that import once, about 20 ms).
        preemption.load()
        with self._lock:
            if self._stopped:
                return
            if self._child is not None:
                self._pending = True
                return
            self._pending = False
            forbidden = fork_forbidden()
            if forbidden:
                self._note(forbidden)
                if self._pages is not None:  # no more saves to spare: untrack the memory
                    self._pages.close()
                    self._pages = self._base = None
                return
            read_fd, write_fd = os.pipe()
            told_fd, tell_fd = os.pipe()  # the page snapshot just after the fork, to the child
            started = time.perf_counter()
            if self._pages is not None:
                self._snapshot = self._pages.snapshot(register=True).number
            scanned = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork with threads
                pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                os.close(tell_fd)
                _child_main(preemption, write_fd, self._cell, self._base, told_fd)  # no return
            # here, not on the reaping thread: its hundreds of GIL-releasing scan calls would
            # each wait out the running cell's switch interval
            after = self._after_fork()
            self.fork_ms = (time.perf_counter() - started) * 1000  # what the next cell waited
            self.scan_ms = (scanned - started) * 1000
            os.close(write_fd)
            os.close(told_fd)
            self._child, self._forked_at = pid, self._ran
            self._idle.clear()
        reaper = threading.Thread(
            target=self._reap,
            args=(pid, read_fd, tell_fd, self._snapshot, after),
            name="kq-reap",
            daemon=True,
        )
        try:
            reaper.start()
        except RuntimeError:  # no thread to be had: no save either
            os.close(tell_fd)
            os.kill(pid, signal.SIGKILL)
            raise

    def _reap(
        self,
        pid: int,
        read_fd: int,
        tell_fd: int,
        snapshot: int,
        after: page_writes.Snapshot | None,
    ) -> None:
        """Thread: tell the child the page snapshot `after` its fork, read its record, reap it,
        start the coalesced save if one is due (`snapshot`: the number of the one before)."""
        data, deadline = b"", time.monotonic() + CHILD_TIMEOUT_SECONDS
        self._tell(tell_fd, after)
        try:
            while len(data) < RESULT_LIMIT:
                ready, _, _ = select.select(
                    [read_fd], [], [], max(0.0, deadline - time.monotonic())
                )
                if not ready:
                    kernel_log.write("[kernel-queue checkpoint] a continuous save hung: killed")
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    break
                chunk = os.read(read_fd, RESULT_LIMIT)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(read_fd)
            with self._lock, contextlib.suppress(ChildProcessError):  # see `_yield`
                self._yielded = pid  # its pid may be another process's once reaped
                os.waitpid(pid, 0)
        record = _parse(data)
        if record.get("checkpoint"):
            self.saves += 1
            found = record.get("digests") or []
            self._trusted = (self._forked_at, {int(i): (int(n), str(d)) for i, n, d in found})
            if self._pages is not None and after is not None:
                self._base = _base(record, snapshot, after.number)
                self._pages.forget(after.number)
        self.last = record
        summary, forked = record["summary"], f"forked in {self.fork_ms:.1f} ms"
        if self._pages is not None:
            forked += f", pages scanned in {self.scan_ms:.1f} ms"
        if record.get("pages"):
            summary += "; arrays " + ", ".join(f"{n} {k}" for k, n in record["pages"].items())
        kernel_log.write(f"[kernel-queue checkpoint] continuous save ({forked}): {summary}")
        with self._lock:
            self._child = None
            again = self._pending and not self._stopped
            self._idle.set()
        if again:
            kernel = self.preemption.kernel
            with contextlib.suppress(Exception):
                kernel.io_loop.add_callback(self._coalesced)

    def _after_fork(self) -> page_writes.Snapshot | None:
        """Main thread, just after the fork: the page snapshot the child gets (whatever a thread
        wrote around the fork reads as written to it); None without tracking, or on failure."""
        pages = self._pages
        if pages is None:
            return None
        try:
            return pages.snapshot()
        except Exception as exc:  # the child saves without, hashing
            kernel_log.write(f"[kernel-queue checkpoint] no page snapshot for the save: {exc!r}")
            return None

    @staticmethod
    def _tell(tell_fd: int, after: page_writes.Snapshot | None) -> None:
        """Send the child the snapshot taken just after its fork (end of file: none)."""
        try:
            if after is not None:
                data = pickle.dumps(after, pickle.HIGHEST_PROTOCOL)
                with contextlib.suppress(OSError):  # the child died: it needs nothing
                    while data:
                        data = data[os.write(tell_fd, data) :]
        finally:
            os.close(tell_fd)

    def _kill(self) -> None:
        with self._lock:
            pid = self._child
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _note(self, why: str) -> None:
        """Once: say that continuous checkpoints are paused, and why."""
        if self._noted:
            return
        self._noted = True
        self.preemption.publish(
            f"kernel-queue: checkpoints after each cell are paused because {why} (a GPU context "
            "cannot be copied by fork); a preemption still saves the variables, but if the "
            "kernel is killed without warning, what changed since its last checkpoint is lost"
        )

    def _write_activity(self) -> None:
        """Thread: keep ``ACTIVITY`` up to date with the last cell that ended (no fsync: it
        only sharpens the restore's sentence after a kill)."""
        while self._activity_ready.wait():
            self._activity_ready.clear()
            with self._activity_lock:
                if self._activity is None or self._stopped or self.preemption.stopping():
                    continue
                cell, ended = self._activity
                path = self.preemption.store.root / ACTIVITY
                tmp = path.with_name(ACTIVITY + ".tmp")
                with contextlib.suppress(OSError):  # no store yet: no checkpoint to speak of
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, durable.FILE_MODE)
                    with open(fd, "w", encoding="utf-8") as file:
                        json.dump({"cell": cell, "ended": ended}, file)
                    os.replace(tmp, path)


def read_activity(root: os.PathLike[str] | str) -> tuple[int | None, float] | None:
    """The last cell that ended in the kernel whose store is ``root``, and when; None unknown."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        with open(os.path.join(root, ACTIVITY), encoding="utf-8") as file:
            record = json.load(file)
        cell = record.get("cell")
        return (cell if isinstance(cell, int) else None), float(record["ended"])
    return None


def _child_main(
    preemption: Host,
    write_fd: int,
    cell: int | None,
    base: page_writes.Base | None,
    told_fd: int,
) -> None:
    """The save child: write one incremental checkpoint, send its record, ``os._exit``.
    `base`: the last committed save the parent knows; `told_fd`: where the parent sends the
    page snapshot taken just after the fork (end of file: none)."""
    status = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(signum, signal.SIG_DFL)
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        parent = os.getppid()
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:  # the kernel died before prctl took effect
            os._exit(1)
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - never IOPub's
        told = b""
        while chunk := os.read(told_fd, 1 << 20):
            told += chunk
        os.close(told_fd)
        store = preemption.store
        committed = store.committed()
        newest = committed[-1] if committed else None
        history = None
        if told and base is not None and newest is not None and newest.id == base.id:
            history = pickle.loads(told).history(base)  # else: digests of another checkpoint
        report = checkpoint.save(
            preemption.module,
            store,
            hidden=set(preemption.kernel.shell.user_ns_hidden),
            extra={"trigger": TRIGGER, "cell": cell, "generation": preemption.options.generation},
            base=newest,
            history=history,
        )
        cp = report.checkpoint
        record = {
            "checkpoint": None if cp is None else cp.id,
            "cell": cell,
            "bytes": report.bytes,
            "reused": report.reused,
            "seconds": round(report.seconds, 3),
            "summary": checkpoint.summary(report),
            "digests": [[key, size, digest] for key, (size, digest) in report.digests.items()],
            "places": [[*key, size, digest] for key, (size, digest) in report.places.items()],
            "pages": history.counts if history is not None else None,
        }
        data = json.dumps(record).encode()[:RESULT_LIMIT]
        while data:
            data = data[os.write(write_fd, data) :]
        status = 0
    except BaseException:  # whatever happened, the child must not return into the kernel
        status = 1
    finally:
        os._exit(status)


def _user_code_running(kernel: Any) -> bool:
    """Whether a thread or an asyncio task of the user's (not the kernel's, not ours) exists."""
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.name.startswith(("kq-", "preempt-")):
            continue
        target = getattr(thread, "_target", None)
        where = getattr(target, "__module__", None) or type(thread).__module__
        if not str(where).startswith(KERNEL_CODE):
            return True
    loop = getattr(getattr(kernel, "io_loop", None), "asyncio_loop", None)
    try:
        tasks = asyncio.all_tasks(loop) if loop is not None else set()
    except RuntimeError:
        return True
    for task in tasks:
        frame = getattr(task.get_coro(), "cr_frame", None)
        name = frame.f_globals.get("__name__", "") if frame is not None else ""
        if not str(name).startswith(KERNEL_CODE):
            return True
    return False


def _base(record: Mapping[str, Any], snapshot: int, forked: int) -> page_writes.Base | None:
    """The committed save of a child's record, forked between page snapshots `snapshot` and
    `forked`."""
    try:
        places = {
            (int(a), int(n), str(d), tuple(int(x) for x in shape), bool(f)): (int(size), str(h))
            for a, n, d, shape, f, size, h in record.get("places") or ()
        }
    except (TypeError, ValueError):
        return None
    return page_writes.Base(str(record["checkpoint"]), snapshot, forked, places)


def _parse(data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("summary"), str):
        return {"checkpoint": None, "summary": "the save child ended without a checkpoint"}
    return record
