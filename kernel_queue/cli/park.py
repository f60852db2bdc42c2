"""`jupyter kernel-queue park <id>` and `jupyter kernel-queue resume <id>`.

Park a running kernel now (it saves, gives its GPUs back and stays listed as parked) or wake a
parked one (it goes back to its queue and comes back with its variables), through the server's
REST API (`POST /api/kernel-queue/kernels/<id>/park|resume`). The server (and the token) is
found as `status` finds it; the id may be shortened to any unique prefix, as `status` prints it
(8 characters). Errors are `status`'s sentences.
"""

from __future__ import annotations

import os
import sys
from typing import Any, ClassVar

from jupyter_core.application import JupyterApp
from traitlets import Unicode, default

from kernel_queue.cli import arguments, status
from kernel_queue.cli.status import StatusError


def resolve(listing: list[dict[str, Any]], prefix: str, where: str) -> dict[str, Any]:
    """The one kernel of the listing whose id starts with `prefix`."""
    wanted = prefix.strip().lower()
    matches = [k for k in listing if wanted and str(k.get("id", "")).startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise StatusError(
            f"no kernel {prefix!r} on the server at {where}; `jupyter kernel-queue status` "
            "lists its kernels"
        )
    shown = ", ".join(sorted(str(k["id"]) for k in matches))
    raise StatusError(
        f"{len(matches)} kernels start with {prefix!r} ({shown}); give more of the kernel's id"
    )


def said(action: str, code: int, entry: dict[str, Any]) -> str:
    """What the command prints: the kernel's sentence after the action."""
    queue = entry.get("queue") or {}
    who = f"kernel {str(entry.get('id', ''))[:8]}"
    state = queue.get("state") or entry.get("execution_state") or "unknown"
    if action == "resume" and code == 200 and state != "parked":
        return f"{who} is not parked ({state}): nothing to resume"
    return f"{who}: {queue.get('message') or state}"


class KernelActionApp(arguments.StrictOptions):
    """Shared by `park` and `resume`: find the server and the kernel, post the action."""

    action: ClassVar[str] = ""
    takes_arguments = True
    url = Unicode(
        "", config=True, help="Base URL of the Jupyter server (default: the running one)."
    )
    token = Unicode(config=True, help="The server's token (default: $JUPYTER_TOKEN).")

    @default("token")
    def _token_from_env(self) -> str:
        return os.environ.get("JUPYTER_TOKEN", "")

    def start(self) -> None:
        command = self.command
        if len(self.extra_args) != 1:
            print(f"usage: {command} KERNEL_ID [--url URL --token TOKEN]", file=sys.stderr)
            self.exit(2)
        try:
            url, token = (self.url, self.token) if self.url else status.running_server()
            where = url.rstrip("/") + "/"
            try:
                listing = status.fetch(url, token, status.KERNELS)
            except StatusError as exc:
                if exc.code == 404:
                    raise StatusError(
                        f"the Jupyter server at {where} does not run the kernel_queue server "
                        "extension, which parks kernels"
                    ) from exc
                raise
            kernel = resolve(listing, self.extra_args[0], where)
            path = f"{status.KERNELS}/{kernel['id']}/{self.action}"
            code, entry = status.request(url, token, path, method="POST")
        except StatusError as exc:
            print(f"{command}: {exc}", file=sys.stderr)
            self.exit(1)
        print(said(self.action, code, entry))


class ParkApp(KernelActionApp):
    """Park a running kernel now: it saves, gives back its GPUs and waits, listed as parked.

    Example: jupyter kernel-queue park 1a2b3c4d
    """

    name = "jupyter-kernel-queue-park"
    description = __doc__
    command = "jupyter kernel-queue park"
    action = "park"
    aliases = {**JupyterApp.aliases, "url": "ParkApp.url", "token": "ParkApp.token"}


class ResumeApp(KernelActionApp):
    """Wake a parked kernel: it waits in its queue and comes back with its variables.

    Example: jupyter kernel-queue resume 1a2b3c4d
    """

    name = "jupyter-kernel-queue-resume"
    description = __doc__
    command = "jupyter kernel-queue resume"
    action = "resume"
    aliases = {**JupyterApp.aliases, "url": "ResumeApp.url", "token": "ResumeApp.token"}
