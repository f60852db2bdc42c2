"""The kernel the launcher starts: ``python -m kernel_queue.launcher.kernel -f CONNECTION_FILE``.

An IPython kernel that tells its launcher, through its exit status, whether the frontend asked
for a restart (75) or a final shutdown (0), and holds each execute until the clients' IOPub
subscriptions have settled (``subscriptions``), so a reconnecting client loses no output. With
``KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR`` set it restores its state through ``checkpointing`` and
saves it through ``preemption`` (143 after a preemption). Only these modules import IPython.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import zmq
from ipykernel.iostream import IOPubThread
from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp
from traitlets import default

from kernel_queue import launcher
from kernel_queue.launcher import contract, kernel_log, subscriptions

if TYPE_CHECKING:
    from kernel_queue.launcher.preemption import Preemption

UNQUEUED = (
    "kernel-queue: this kernel runs only under the kernel-queue launcher, which the kernel-queue "
    "provisioner starts once the queue admits the kernel. It was started directly, which would "
    "skip the queue: jupyter_client older than 8 (Enterprise Gateway 3) ignores kernel "
    "provisioners. Under Enterprise Gateway 3 use a kernelspec written by `jupyter kernel-queue "
    "install --gateway enterprise-gateway`; elsewhere install `kernel-queue[server]`."
)
"""Said (with exit status 2) when the kernelspec's command runs without the launcher."""
USAGE_ERROR_EXIT_CODE = 2
LOAD_DELAY = 1.0
"""Seconds after its start when a kernel with checkpoints imports what its saves need and its
start did not (`checkpoint.load`: about 20 ms): after its first replies, before a SIGTERM's save
would spend its grace on it, or each cell's save (a forked child) would import it again."""
SUBSCRIPTIONS = subscriptions.Subscriptions()
"""This process's IOPub subscriptions, reported through ipykernel 7's XPUB welcome."""


class RestartAwareKernel(IPythonKernel):
    """An IPythonKernel that remembers the ``restart`` flag of the last ``shutdown_request``.

    With checkpointing, its shell adopts ``preset_module`` (the restored ``__main__``) and its
    execute and shutdown requests pass through the ``preemption`` hooks.
    """

    restart_requested = False
    preset_module: ClassVar[ModuleType | None] = None
    preemption: Preemption | None = None

    _shell_busy = False  # a shell request has begun in this process

    @default("user_module")
    def _preset_user_module(self) -> ModuleType | None:
        return type(self).preset_module

    def start(self) -> None:
        """ipykernel's, then `idle` once IOPub subscriptions settle (``_say_idle``); with
        checkpoints, the rest of their library `LOAD_DELAY` later (``Preemption.load``)."""
        super().start()  # type: ignore[no-untyped-call]
        self.io_loop.add_callback(self._say_idle)
        if self.preemption is not None:
            self.io_loop.call_later(LOAD_DELAY, self.preemption.load)

    async def _say_idle(self) -> None:
        """Publish `idle` (without parent) unless a shell request began first. ipykernel says
        only `starting` at start and `idle` after a request, and a client that stayed connected
        while this kernel replaced the last one (a resume after preemption, a restart in place)
        shows the last status it got: JupyterLab read "Starting" until the next cell."""
        await SUBSCRIPTIONS.settled(once=False)
        if not self._shell_busy:
            self._publish_status("idle", "shell")

    def _publish_status(self, status: str, channel: str, parent: Any = None) -> None:
        if channel == "shell" and status == "busy":
            self._shell_busy = True
            shell = parent or self.get_parent("shell")  # type: ignore[no-untyped-call]
            header = (shell or {}).get("header") or {}
            SUBSCRIPTIONS.message(str(header.get("session", "")), str(header.get("msg_id", "")))
            SUBSCRIPTIONS.busy(str(header.get("msg_id", "")))
        super()._publish_status(status, channel, parent)  # type: ignore[no-untyped-call]

    async def execute_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """ipykernel's handler, held until IOPub subscriptions settle, between the preemption
        hooks: a client that was connected to the kernel this one replaced (restart, requeue,
        wake) may get its shell reconnected before its IOPub, and output published meanwhile is
        lost. A client's first request in this process also waits (briefly) for the
        subscription a blocking client sends only once it reads its output
        (``subscriptions.LATE_WAIT``). A client that subscribed since ipykernel said `busy`
        (just before this; `Subscriptions.asked`) is told again.
        """
        header = parent.get("header") or {}
        session, msg_id = str(header.get("session", "")), str(header.get("msg_id", ""))
        asked = SUBSCRIPTIONS.asked(msg_id)
        if SUBSCRIPTIONS.opens_session(session, msg_id):
            await SUBSCRIPTIONS.late(asked)
        await SUBSCRIPTIONS.settled()
        if SUBSCRIPTIONS.since(asked):
            self._publish_status("busy", "shell", parent)
        hooks = self.preemption
        if hooks is not None:
            hooks.before_execute(parent)
        try:
            await super().execute_request(stream, ident, parent)  # type: ignore[no-untyped-call]
        finally:
            if hooks is not None:
                hooks.after_execute()

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """Called by ipykernel's ``shutdown_request`` handler on the control thread."""
        self.restart_requested = bool(restart)
        if self.preemption is not None:
            self.preemption.on_shutdown(bool(restart))
        reply = super().do_shutdown(restart)  # type: ignore[no-untyped-call]
        if inspect.isawaitable(reply):
            reply = await reply
        return dict(reply)


class QueuedKernelApp(IPKernelApp):
    """IPKernelApp whose IOPub socket reports every subscription, not only the first.

    ZeroMQ's XPUB passes on only a topic's first subscription; all Jupyter clients subscribe
    to the same (empty) topic, so without ``XPUB_VERBOSE`` a second client coming back would
    be invisible (and would get no iopub_welcome of its own). Set before the socket is bound.
    """

    def _bind_socket(self, s: Any, port: int) -> Any:
        if s.socket_type == zmq.XPUB:
            s.setsockopt(zmq.XPUB_VERBOSE, 1)
        return super()._bind_socket(s, port)  # type: ignore[no-untyped-call]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the kernel until a ``shutdown_request`` or a preemption stops its loops.

    Returns the exit status: 0, 75 (restart) or 143 (preempted, state saved or not).
    """
    try:
        if contract.parse_generation(os.environ) is None:
            print(UNQUEUED, file=sys.stderr, flush=True)
            return USAGE_ERROR_EXIT_CODE
        checkpointing = contract.parse_checkpointing(os.environ) is not None
    except contract.SettingsError as exc:  # the launcher checked these first: run by hand
        print(f"kernel-queue: error: {exc}", file=sys.stderr, flush=True)
        return USAGE_ERROR_EXIT_CODE
    kernel_log.remember()  # before ipykernel redirects fd 2 into the notebook
    _watch_iopub_subscribers()
    arguments = sys.argv[1:] if argv is None else list(argv)
    # Before initialize() binds any port.
    preemption = _restore_first(os.environ, arguments) if checkpointing else None
    app = QueuedKernelApp.instance(kernel_class=RestartAwareKernel)
    app.initialize(None if argv is None else list(argv))  # type: ignore[no-untyped-call]
    if preemption is not None:
        app.kernel.preemption = preemption
        preemption.install(app.kernel)
    app.start()  # type: ignore[no-untyped-call]
    if preemption is not None and preemption.exit_status is not None:
        _exit_after(contract.PREEMPTED_EXIT_SECONDS, preemption.exit_status)
        return preemption.exit_status
    restart = bool(getattr(app.kernel, "restart_requested", False))
    status = launcher.RESTART_EXIT_CODE if restart else 0
    _exit_after(contract.SHUTDOWN_EXIT_SECONDS, status)
    return status


def _watch_iopub_subscribers() -> None:
    """Tell ``SUBSCRIPTIONS`` each time ipykernel welcomes a new IOPub subscriber."""
    original = getattr(IOPubThread, "_send_welcome_message", None)
    if original is None:  # no welcome in this ipykernel: do not hold anything
        SUBSCRIPTIONS.unknowable()
        return

    def send_welcome(self: IOPubThread, subscription: str) -> None:
        original(self, subscription)
        SUBSCRIPTIONS.seen()

    IOPubThread._send_welcome_message = send_welcome  # type: ignore[method-assign]


def _restore_first(environ: Mapping[str, str], argv: Sequence[str] = ()) -> Preemption | None:
    """With checkpointing on: restore the state and return the hooks.

    Only then is the checkpoint library imported; its serializer (dill) only where there is a
    checkpoint to restore, else once the kernel runs (`RestartAwareKernel.start`). The
    checkpoint secret is derived from the key in the connection file (``-f FILE``).
    """
    try:
        from kernel_queue import checkpoint
        from kernel_queue.launcher import checkpointing
    except ImportError as exc:  # the image lacks part of the checkpoint library
        _without_checkpoints(environ, exc.name or str(exc))
        return None
    missing = checkpoint.missing()  # dill: imported at the first restore or save, not here
    if missing is not None:
        _without_checkpoints(environ, missing)
        return None
    options = checkpointing.Options.from_env(environ, _connection_file(argv))
    if options is None:
        return None
    preemption = checkpointing.prepare(options)
    RestartAwareKernel.preset_module = preemption.module
    return preemption


def _without_checkpoints(environ: Mapping[str, str], missing: str) -> None:
    """The kernel runs without checkpoints: say why in its log, and leave the sentence in the
    launcher's report, which a preemption passes on (the pod's termination message)."""
    sentence = (
        f"checkpoint not saved: the kernel's image has no {missing}, which checkpoints need, so "
        f"a preemption loses the kernel's variables; add {missing} to the image "
        f"(pip install {missing})"
    )
    kernel_log.write(f"[kernel-queue checkpoint] {sentence}")
    report = environ.get(contract.ENV_CHECKPOINT_REPORT)
    if report:
        summary = {"checkpoint": None, "error": f"no module named {missing}", "summary": sentence}
        with contextlib.suppress(OSError), open(report, "w", encoding="utf-8") as file:
            json.dump(summary, file)


def _connection_file(argv: Sequence[str]) -> str | None:
    """The ``-f`` (``--f``) argument, as IPKernelApp reads it: ``-f FILE`` or ``-f=FILE``."""
    for index, arg in enumerate(argv):
        if arg in ("-f", "--f") and index + 1 < len(argv):
            return argv[index + 1]
        for prefix in ("-f=", "--f="):
            if arg.startswith(prefix):
                return arg[len(prefix) :]
    return None


def _exit_after(seconds: float, status: int) -> None:
    """End the process with ``status`` if the normal exit hangs.

    After ``shutdown_request`` the interpreter joins every non-daemon thread before it runs
    ipykernel's atexit ``close()``; a thread a user started in a cell would block that forever
    and the launcher would never see the restart. A daemon timer still runs during that join.
    """

    def force_exit() -> None:
        sys.stderr.flush()
        os._exit(status)

    timer = threading.Timer(seconds, force_exit)
    timer.daemon = True
    timer.start()


if __name__ == "__main__":
    sys.exit(main())
