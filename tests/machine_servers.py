"""Real Jupyter servers of one user on one machine, for the machine-queue tests.

`Machine` is one user's machine: a short runtime directory (its queue socket must fit in a Unix
socket path) shared by every process, one pretend GPU, and kernelspecs `low` and `high` (1 GPU
each, checkpoints on). `Machine.server()` starts a real `jupyter_server` process with the
kernel-queue extension and `ServerProcess` drives it over REST and the kernel websocket, as a
notebook client does; `Machine.nbconvert()` runs `jupyter nbconvert --execute` on a queued
kernel. Everything started is stopped at the end, and a service left running is reported.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

from tests import polling
from tests.messages import run_cell
from tests.ports import free_port as _free_port

JUPYTER = str(Path(sys.executable).parent / "jupyter")
TOKEN = "machine-queue-test"


def kernelspec(name: str, priority_class: str) -> dict[str, Any]:
    config = {
        "backend": "local",
        "queue": "gpu",
        "gpus": 1,
        "priority_class": priority_class,
        "startup_timeout": 120,
        "checkpoint": {"enabled": True, "grace_seconds": 30},
    }
    return {
        "argv": [sys.executable, "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"],
        "display_name": f"Python 3 ({name}, queued)",
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {"kernel_provisioner": {"provisioner_name": "kernel-queue", "config": config}},
    }


class ServerProcess:
    """One `jupyter server` process and the REST/websocket calls a notebook client makes."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.log = log
        self.base = f"http://127.0.0.1:{port}"

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        request = HTTPRequest(
            f"{self.base}/{path}",
            method=method,
            headers={"Authorization": f"token {TOKEN}"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=60,
        )
        response = await AsyncHTTPClient().fetch(request, raise_error=False)
        if response.code >= 400 and response.code != 404:
            raise AssertionError(f"{method} {path}: {response.code} {response.body[:500]!r}")
        return json.loads(response.body) if response.body else None

    async def start(self, name: str) -> str:
        return str((await self.request("POST", "api/kernels", {"name": name}))["id"])

    async def model(self, kernel_id: str) -> dict[str, Any]:
        return dict(await self.request("GET", f"api/kernels/{kernel_id}") or {})

    async def state(self, kernel_id: str) -> str | None:
        """The kernel's state in the server's queue listing (running, queued, ...)."""
        listing = await self.request("GET", "api/kernel-queue/kernels")
        queue = next((k["queue"] for k in listing if k["id"] == kernel_id), None)
        return None if queue is None else str(queue["state"])

    async def shutdown(self, kernel_id: str) -> None:
        await self.request("DELETE", f"api/kernels/{kernel_id}")

    async def reason(self, kernel_id: str, text: str, within: float = polling.WITHIN) -> str:
        """Wait until the kernel's reason contains `text`; return it."""
        seen: dict[str, Any] = {}

        async def says() -> bool:
            seen.update(await self.model(kernel_id))
            return text in str(seen.get("reason", ""))

        await polling.until(
            says, f"a reason containing {text!r}", within=within, detail=lambda: seen
        )
        return str(seen["reason"])

    async def execute(self, kernel_id: str, code: str, within: float = 120) -> dict[str, Any]:
        """Run `code` on the kernel's websocket: its execute_result text, stream, error name."""
        url = f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels?token={TOKEN}"
        ws = await websocket_connect(url)
        try:
            cell = await run_cell(ws, code, within=within)
        finally:
            ws.close()
        return {"data": cell["data"], "stream": cell["stream"], "error": cell["ename"]}

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, as a user's ^C; the server shuts its kernels down."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


class Machine:
    """One user's machine with one pretend GPU; `server()` and `nbconvert()` run on it."""

    def __init__(self, root: Path, gpus: tuple[str, ...] = ("0",)) -> None:
        self.root = root
        self.runtime = Path(tempfile.mkdtemp(prefix="kq-", dir="/tmp"))  # a short socket path
        self.socket = self.runtime / "kernel-queue" / "queue.sock"
        self.servers: list[ServerProcess] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
        self.env.pop("PYTEST_CURRENT_TEST", None)
        self.env.update(
            HOME=str(root / "home"),
            JUPYTER_DATA_DIR=str(root / "data"),
            JUPYTER_CONFIG_DIR=str(root / "config"),
            JUPYTER_RUNTIME_DIR=str(self.runtime),
            JUPYTER_PLATFORM_DIRS="1",
            PYTHONPATH=str(Path(__file__).resolve().parent.parent),
        )
        config = {
            # Only ours: the lab, LSP and notebook extensions add seconds to each start.
            "ServerApp": {
                "jpserver_extensions": {
                    "kernel_queue": True,
                    **dict.fromkeys(("jupyterlab", "jupyter_lsp", "notebook_shim"), False),
                }
            },
            "LocalBackend": {"gpus": list(gpus)},
        }
        (root / "config").mkdir(parents=True)
        (root / "home").mkdir()
        (root / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
        (root / "config" / "jupyter_nbconvert_config.json").write_text(json.dumps(config))
        for name, klass in (("low", "low"), ("high", "high")):
            folder = root / "data" / "kernels" / name
            folder.mkdir(parents=True)
            (folder / "kernel.json").write_text(json.dumps(kernelspec(name, klass)))

    async def server(self) -> ServerProcess:
        """A real jupyter_server process of this user, answering its REST API."""
        port = _free_port()
        index = len(self.servers)
        notebooks = self.root / f"notebooks-{index}"
        notebooks.mkdir()
        log = self.root / f"server-{index}.log"
        argv = [
            *(sys.executable, "-m", "jupyter_server", "--no-browser"),
            f"--port={port}",
            f"--IdentityProvider.token={TOKEN}",
            f"--ServerApp.root_dir={notebooks}",
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ]
        process = await asyncio.to_thread(self._spawn, argv, log, notebooks)
        server = ServerProcess(process, port, log)
        self.servers.append(server)

        async def answers() -> bool:
            assert process.poll() is None, f"the server exited: {log.read_text()[-3000:]}"
            try:
                await server.request("GET", "api/status")
            except (OSError, AssertionError):
                return False
            return True

        await polling.until(answers, "the server answering", detail=lambda: log.read_text()[-2000:])
        return server

    def _spawn(self, argv: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd
            )

    def notebook(self, name: str, *cells: str) -> Path:
        cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None}
        document = {
            "cells": [{**cell, "source": source} for source in cells],
            "metadata": {
                "kernelspec": {"name": "low", "display_name": "low", "language": "python"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        path = self.root / name
        path.write_text(json.dumps(document))
        return path

    async def nbconvert(self, notebook: Path, kernel: str) -> asyncio.subprocess.Process:
        """`jupyter nbconvert --execute` of `notebook` on kernelspec `kernel`, started."""
        return await asyncio.create_subprocess_exec(
            *(JUPYTER, "nbconvert", "--to", "notebook", "--execute", str(notebook)),
            f"--ExecutePreprocessor.kernel_name={kernel}",
            "--ExecutePreprocessor.startup_timeout=180",
            "--output",
            f"{notebook.stem}-out",
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=self.root,
        )

    def service_pid(self) -> int | None:
        """The pid of the service answering on this machine's socket (from its log), if any."""
        log = self.socket.with_name("queue.log")
        if not self.socket.exists() or not log.exists():
            return None
        for line in reversed(log.read_text().splitlines()):
            if "kernel-queue service" in line and " on " in line and "(pid " in line:
                return int(line.split("(pid ")[1].split(")")[0])
        return None

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.runtime, ignore_errors=True)
