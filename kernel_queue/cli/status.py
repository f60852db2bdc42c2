"""`jupyter kernel-queue status`: list a running server's kernels with their queue state.

Reads the server's REST API: `/api/kernel-queue/kernels` (or plain `/api/kernels` when the
server lacks the kernel-queue extension), `/api/sessions` for each kernel's notebook, and
`/api/kernel-queue/machine` for the capacity line of the local backend. Finds the server from
Jupyter's runtime files unless `--url` is given; the token is `--token`, else $JUPYTER_TOKEN.
Every failure is one sentence saying what to pass, exit status 1. `--machine` lists the
machine queue instead (every server's kernels, other users' as the system service's privacy
shows them), read from the queue service with a listing-only hello: it never starts a service.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from jupyter_core.application import JupyterApp
from traitlets import Bool, Unicode, default

from kernel_queue.cli import arguments
from kernel_queue.errors import KernelQueueError
from kernel_queue.machine import client, protocol

KERNELS = "api/kernel-queue/kernels"
SESSIONS = "api/sessions"
MACHINE = "api/kernel-queue/machine"
_TIMEOUT = 60  # s: a park answers once the kernel shows it is parking
COLUMNS = ("KERNEL", "KERNELSPEC", "STATE", "QUEUE", "POSITION", "GPUS", "MESSAGE")
"""The columns `rows` gives by default."""
TABLE = (
    "KERNEL",
    "NOTEBOOK",
    "KERNELSPEC",
    "STATE",
    "QUEUE",
    "POSITION",
    "WAITING",
    "GPUS",
    "MESSAGE",
)
"""The columns `jupyter kernel-queue status` prints."""
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
        raise StatusError(
            "no running Jupyter server found; start one with `jupyter lab` or pass --url"
        )
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
        raise StatusError(_refusal(exc, where, token), code=exc.code) from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError | socket.gaierror):
            raise StatusError(no_server(where)) from exc
        raise StatusError(f"could not reach the Jupyter server at {where} ({exc.reason})") from exc
    except TimeoutError as exc:
        raise StatusError(
            f"the Jupyter server at {where} did not answer within {_TIMEOUT} s"
        ) from exc
    except (OSError, ValueError) as exc:
        raise StatusError(f"could not read the Jupyter server at {where}: {exc}") from exc


def no_server(where: str) -> str:
    """The sentence for a URL where no Jupyter server answers."""
    return f"no Jupyter server at {where}; start one with `jupyter lab` or pass --url"


def _refusal(exc: urllib.error.HTTPError, where: str, token: str) -> str:
    try:
        message = str(json.loads(exc.read() or b"{}").get("message") or "")
    except (OSError, ValueError, AttributeError):
        message = ""
    if exc.code in (401, 403):
        if not token:
            return f"the server at {where} wants a token; pass --token (or set JUPYTER_TOKEN)"
        return f"the server at {where} rejected the token; pass --token (or set JUPYTER_TOKEN)"
    return message or f"the Jupyter server at {where} answered {exc.code} {exc.reason}"


def fetch(url: str, token: str, path: str) -> Any:
    """GET `path` under the server's base `url`; return the decoded JSON."""
    return request(url, token, path)[1]


def rows(
    listing: list[dict[str, Any]],
    columns: Sequence[str] = COLUMNS,
    *,
    notebooks: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> list[tuple[str, ...]]:
    """One table row per kernel from the REST listing, with `columns` (of `TABLE`);
    `notebooks` maps kernel ids to their session's path, `now` is when WAITING is measured."""
    when = now or datetime.now(UTC)
    table: list[tuple[str, ...]] = []
    for kernel in listing:
        queue = kernel.get("queue") or {}
        position = ""
        if queue.get("position"):
            position = f"{queue['position']} of {queue['queue_length']}"
        cells = {
            "KERNEL": kernel["id"][:8],
            "NOTEBOOK": (notebooks or {}).get(kernel["id"], "-"),
            "KERNELSPEC": kernel.get("name", ""),
            "STATE": queue.get("state") or kernel.get("execution_state", ""),
            "QUEUE": queue.get("queue", ""),
            "POSITION": position,
            "WAITING": waited(kernel.get("waiting_since"), when),
            "GPUS": str(queue.get("gpus", "")),
            "MESSAGE": queue.get("message") or kernel.get("reason", ""),
        }
        table.append(tuple(cells[column] for column in columns))
    return table


def waited(since: str | None, now: datetime) -> str:
    """How long a kernel has waited since `since` (ISO 8601): "45 s", "3 min", "2 h 5 min";
    "" when it does not wait."""
    if not since:
        return ""
    try:
        start = datetime.fromisoformat(since)
    except ValueError:
        return ""
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    seconds = max(0, int((now - start).total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def notebooks(sessions: Any) -> dict[str, str]:
    """Kernel id -> the path of the session (notebook, console) that uses it."""
    found: dict[str, str] = {}
    for session in sessions if isinstance(sessions, list) else []:
        kernel = (session or {}).get("kernel") or {}
        if kernel.get("id") and session.get("path"):
            found.setdefault(str(kernel["id"]), str(session["path"]))
    return found


def render(table: list[tuple[str, ...]], columns: Sequence[str] = COLUMNS) -> str:
    """Aligned columns, the last one unpadded."""
    lines = [tuple(columns), *table]
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
    queued = sum(e.state == "queued" for e in listing.groups)
    return capacity_line(listing.gpus, listing.gpus_in_use, queued, listing.hidden)


def capacity_line(gpus: int, in_use: int, queued: int, hidden: Mapping[str, int]) -> str:
    """The capacity sentence: GPUs in use and kernels waiting, the hidden ones counted."""
    waiting = queued + hidden.get("queued", 0)
    line = f"GPUs: {in_use} of {gpus} in use; {waiting} waiting"
    if hidden:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(hidden.items()))
        line += f"\nOther users' kernels: {counts}"
    return line


def server_capacity(body: Any) -> str:
    """The capacity line from `GET /api/kernel-queue/machine`; "" when the server has no
    local-backend kernel yet (it is not connected to the machine's queue service)."""
    if not isinstance(body, dict) or not body.get("service"):
        return ""
    kernels = body.get("kernels") or []
    queued = sum(k.get("state") == "queued" for k in kernels if isinstance(k, dict))
    gpus = len(body.get("gpus") or [])
    return capacity_line(gpus, int(body.get("gpus_in_use") or 0), queued, body.get("hidden") or {})


class StatusApp(arguments.StrictOptions):
    """List kernels with their notebook, state, place in the queue and wait so far.

    Example: jupyter kernel-queue status --url http://localhost:8888/ --token abc
    """

    name = "jupyter-kernel-queue-status"
    description = __doc__
    command = "jupyter kernel-queue status"
    url = Unicode(
        "", config=True, help="Base URL of the Jupyter server (default: the running one)."
    )
    token = Unicode(config=True, help="The server's token (default: $JUPYTER_TOKEN).")
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

    @default("token")
    def _token_from_env(self) -> str:
        return os.environ.get("JUPYTER_TOKEN", "")

    def start(self) -> None:
        if self.machine:
            self.start_machine()
            return
        try:
            url, token = (self.url, self.token) if self.url else running_server()
            listing, names, line = self.read(url, token or self.token)
        except StatusError as exc:
            print(f"{self.command}: {exc}", file=sys.stderr)
            self.exit(1)
        if self.as_json:
            print(json.dumps(listing, indent=2))
            return
        print(render(rows(listing, TABLE, notebooks=names), TABLE) if listing else "No kernels.")
        if line:
            print(line)

    @staticmethod
    def read(url: str, token: str) -> tuple[list[dict[str, Any]], dict[str, str], str]:
        """The server's kernels, their notebooks and the capacity line ("" if none)."""
        try:
            listing = fetch(url, token, KERNELS)
        except StatusError as exc:
            if exc.code != 404:
                raise
            try:  # no kernel-queue extension there
                listing = fetch(url, token, "api/kernels")
            except StatusError as plain:
                if plain.code == 404:
                    raise StatusError(no_server(url.rstrip("/") + "/")) from plain
                raise
            return listing, notebooks(fetch(url, token, SESSIONS)), ""
        names = notebooks(fetch(url, token, SESSIONS))
        try:
            line = server_capacity(fetch(url, token, MACHINE))
        except StatusError as exc:
            if exc.code != 404:
                raise
            line = ""  # a server of an older kernel-queue
        return listing, names, line

    def start_machine(self) -> None:
        """`--machine`: the machine queue's table and its capacity line."""
        try:
            listing = asyncio.run(machine_listing())
        except KernelQueueError as exc:
            print(f"{self.command}: {exc}", file=sys.stderr)
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
