"""`jupyter kernel-queue status`: list a running server's kernels with their queue state.

Reads the server's REST API (`/api/kernel-queue/kernels`, or plain `/api/kernels` when the
server lacks the kernel-queue extension). Finds the server from Jupyter's runtime files unless
`--url` and `--token` are given. `--machine` lists the machine queue instead (every server's
kernels, other users' as the system service's privacy shows them), read from the queue service
with a listing-only hello: it never starts a service.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from jupyter_core.application import JupyterApp
from traitlets import Bool, Unicode

from kernel_queue.errors import KernelQueueError
from kernel_queue.machine import client, protocol

KERNELS = "api/kernel-queue/kernels"
_TIMEOUT = 60  # s: a park answers once the kernel shows it is parking
COLUMNS = ("KERNEL", "KERNELSPEC", "STATE", "QUEUE", "POSITION", "GPUS", "MESSAGE")
MACHINE_COLUMNS = ("KERNEL", "USER", "QUEUE", "STATE", "POSITION", "GPUS", "SERVER PID")
NO_SERVICE = (
    "no kernel-queue service runs on this machine; it starts with the first queued kernel of "
    "the local backend"
)


class StatusError(KernelQueueError):
    """The server could not be found or read; `code` is the HTTP status it answered, if any."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def running_server() -> tuple[str, str]:
    """The URL and token of the newest Jupyter server running as this user."""
    try:
        from jupyter_server.serverapp import list_running_servers
    except ImportError as exc:
        raise StatusError("jupyter_server is not installed; pass --url and --token") from exc
    servers = sorted(list_running_servers(), key=lambda s: s.get("pid", 0))
    if not servers:
        raise StatusError("no running Jupyter server found; start one or pass --url and --token")
    server = servers[-1]
    return str(server["url"]), str(server.get("token", ""))


def request(url: str, token: str, path: str, method: str = "GET") -> tuple[int, Any]:
    """`method` `path` under the server's base `url`; the HTTP status and the decoded JSON.

    Every failure is a `StatusError` in a sentence: the server's own message where it gave one
    (a 409's reason), else what went wrong and what to pass."""
    where = url.rstrip("/") + "/"
    data = b"" if method == "POST" else None
    call = urllib.request.Request(where + path, data=data, method=method)
    if token:
        call.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(call, timeout=_TIMEOUT) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raise StatusError(_refusal(exc, where), code=exc.code) from exc
    except urllib.error.URLError as exc:
        raise StatusError(f"could not reach the Jupyter server at {where} ({exc.reason})") from exc
    except TimeoutError as exc:
        raise StatusError(
            f"the Jupyter server at {where} did not answer within {_TIMEOUT} s"
        ) from exc
    except (OSError, ValueError) as exc:
        raise StatusError(f"could not read the Jupyter server at {where}: {exc}") from exc


def _refusal(exc: urllib.error.HTTPError, where: str) -> str:
    try:
        message = str(json.loads(exc.read() or b"{}").get("message") or "")
    except (OSError, ValueError, AttributeError):
        message = ""
    if exc.code in (401, 403):
        return (
            f"the Jupyter server at {where} refused the request ({exc.code}): "
            f"{message or 'pass its token with --token'}"
        )
    return message or f"the Jupyter server at {where} answered {exc.code} {exc.reason}"


def fetch(url: str, token: str, path: str) -> Any:
    """GET `path` under the server's base `url`; return the decoded JSON."""
    return request(url, token, path)[1]


def rows(listing: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One table row per kernel from the REST listing."""
    table: list[tuple[str, ...]] = []
    for kernel in listing:
        queue = kernel.get("queue") or {}
        position = ""
        if queue.get("position"):
            position = f"{queue['position']} of {queue['queue_length']}"
        table.append(
            (
                kernel["id"][:8],
                kernel.get("name", ""),
                queue.get("state") or kernel.get("execution_state", ""),
                queue.get("queue", ""),
                position,
                str(queue.get("gpus", "")),
                queue.get("message") or kernel.get("reason", ""),
            )
        )
    return table


def render(table: list[tuple[str, ...]], columns: tuple[str, ...] = COLUMNS) -> str:
    """Aligned columns, the last one unpadded."""
    lines = [columns, *table]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns) - 1)]
    out = []
    for line in lines:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        out.append("  ".join([*cells, line[-1]]).rstrip())
    return "\n".join(out)


async def machine_listing() -> protocol.Listing | None:
    """The machine queue as the service shows it to this user; None when no service answers
    (on the system socket, or this user's)."""
    watcher = await client.MachineClient.watch()
    if watcher is None:
        return None
    try:
        return await watcher.listing()
    finally:
        await watcher.aclose()


def machine_rows(listing: protocol.Listing) -> list[tuple[str, ...]]:
    """One table row per group the listing shows; another user's has no kernel id or pid."""
    table: list[tuple[str, ...]] = []
    for entry in listing.groups:
        held = entry.state != "queued"
        table.append(
            (
                entry.kernel_id[:8] or "-",
                entry.user or str(entry.uid),
                entry.queue,
                entry.state,
                str(entry.position) if entry.position else "",
                ",".join(entry.devices) if held else f"needs {entry.gpus}",
                str(entry.pid) if entry.pid else "-",
            )
        )
    return table


def capacity(listing: protocol.Listing) -> str:
    """ "GPUs: 1 of 2 in use; 3 waiting", with the other users' kernels it does not show."""
    waiting = sum(e.state == "queued" for e in listing.groups) + listing.hidden.get("queued", 0)
    line = f"GPUs: {listing.gpus_in_use} of {listing.gpus} in use; {waiting} waiting"
    if listing.hidden:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(listing.hidden.items()))
        line += f"\nOther users' kernels: {counts}"
    return line


class StatusApp(JupyterApp):
    """List kernels with their state and place in the queue.

    Example: jupyter kernel-queue status --url http://localhost:8888/ --token abc
    """

    name = "jupyter-kernel-queue-status"
    description = __doc__
    url = Unicode(
        "", config=True, help="Base URL of the Jupyter server (default: the running one)."
    )
    token = Unicode("", config=True, help="The server's token.")
    as_json = Bool(False, config=True, help="Print the raw listing as JSON.")
    machine = Bool(
        False,
        config=True,
        help="""List the machine's queue (every server's kernels, and other users' on a
        system service) instead of one server's kernels.""",
    )
    aliases = {**JupyterApp.aliases, "url": "StatusApp.url", "token": "StatusApp.token"}
    flags = {
        **JupyterApp.flags,
        "json": ({"StatusApp": {"as_json": True}}, "Print JSON."),
        "machine": ({"StatusApp": {"machine": True}}, "List the machine's queue."),
    }

    def start(self) -> None:
        if self.machine:
            self.start_machine()
            return
        try:
            url, token = (self.url, self.token) if self.url else running_server()
            try:
                listing = fetch(url, token, KERNELS)
            except StatusError as exc:
                if exc.code != 404:
                    raise
                listing = fetch(url, token, "api/kernels")  # no kernel-queue extension there
        except StatusError as exc:
            print(f"jupyter kernel-queue status: {exc}", file=sys.stderr)
            self.exit(1)
        if self.as_json:
            print(json.dumps(listing, indent=2))
        elif not listing:
            print("No kernels.")
        else:
            print(render(rows(listing)))

    def start_machine(self) -> None:
        """`--machine`: the machine queue's table and its capacity line."""
        try:
            listing = asyncio.run(machine_listing())
        except KernelQueueError as exc:
            print(f"jupyter kernel-queue status: {exc}", file=sys.stderr)
            self.exit(1)
        if listing is None:
            print(NO_SERVICE)
        elif self.as_json:
            print(json.dumps(json.loads(protocol.encode(listing)), indent=2))
        else:
            if listing.groups:
                print(render(machine_rows(listing), MACHINE_COLUMNS))
            else:
                print("No kernels in the machine's queue.")
            print(capacity(listing))
