"""Shared fixtures: a real jupyter_server (pytest-jupyter) configured as our etc/jupyter file
configures it, kernelspecs written into the test's own data dir, and small helpers to talk to
kernels over the server's REST and websocket APIs."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["jupyter_server.pytest_plugin"]

REPO = Path(__file__).resolve().parent.parent
SERVER_CONFIG = REPO / "etc" / "jupyter" / "jupyter_server_config.d" / "kernel_queue.json"


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    """`c.LocalBackend` for the test server; tests override keys (2 GPUs by default)."""
    return {"gpus": ["0", "1"]}


@pytest.fixture
def jp_server_config(local_backend_config: dict[str, Any]) -> dict[str, Any]:
    """The shipped server config, plus the local backend's inventory."""
    config: dict[str, Any] = json.loads(SERVER_CONFIG.read_text())
    config["LocalBackend"] = local_backend_config
    config.setdefault("MappingKernelManager", {})["default_kernel_name"] = "queued"
    return config


KernelspecFactory = Callable[..., str]


@pytest.fixture
def kernelspec(jp_kernel_dir: Path) -> KernelspecFactory:
    """Write a queued kernelspec into the test's data dir; return its name."""

    def write(name: str = "queued", metadata: dict[str, Any] | None = None, **config: Any) -> str:
        config.setdefault("backend", "local")
        config.setdefault("queue", "gpu")
        config.setdefault("startup_timeout", 60)
        spec = {
            "argv": ["python", "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"],
            "display_name": f"Queued {name}",
            "language": "python",
            "interrupt_mode": "message",
            "metadata": {
                **(metadata or {}),
                "kernel_provisioner": {"provisioner_name": "kernel-queue", "config": config},
            },
        }
        folder = jp_kernel_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kernel.json").write_text(json.dumps(spec))
        return name

    return write


class Server:
    """Drive the test server the way a notebook client does."""

    def __init__(self, fetch: Any, ws_fetch: Any, serverapp: Any) -> None:
        self.fetch = fetch
        self.ws_fetch = ws_fetch
        self.app = serverapp

    async def start(self, name: str) -> str:
        response = await self.fetch("api", "kernels", method="POST", body=json.dumps({"name": name}))
        return str(json.loads(response.body)["id"])

    async def model(self, kernel_id: str) -> dict[str, Any]:
        response = await self.fetch("api", "kernels", kernel_id, method="GET")
        return dict(json.loads(response.body))

    async def kernel_ids(self) -> set[str]:
        response = await self.fetch("api", "kernels", method="GET")
        return {k["id"] for k in json.loads(response.body)}

    async def shutdown(self, kernel_id: str) -> None:
        await self.fetch("api", "kernels", kernel_id, method="DELETE")

    async def shutdown_and_wait(self, *kernel_ids: str) -> None:
        """DELETE the kernels and wait until they and their launchers are gone."""
        for kernel_id in kernel_ids:
            await self.shutdown(kernel_id)

        async def gone() -> bool:
            return not (await self.kernel_ids()) & set(kernel_ids)

        await self.wait_for(gone)
        await self.wait_for(_no_launchers)

    async def wait_for(
        self, check: Callable[[], Awaitable[bool]], *, timeout: float = 60, what: str = ""
    ) -> None:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.05)

    async def wait_reason(self, kernel_id: str, text: str, timeout: float = 60) -> dict[str, Any]:
        """Wait until the kernel's `reason` contains `text`; return the model."""
        seen: dict[str, Any] = {}

        async def check() -> bool:
            seen.update(await self.model(kernel_id))
            return text in seen.get("reason", "")

        try:
            await self.wait_for(check, timeout=timeout)
        except TimeoutError:
            pytest.fail(f"reason never contained {text!r}; last model: {seen}")
        return seen

    async def execute(self, kernel_id: str, code: str, timeout: float = 60) -> dict[str, Any]:
        """Run `code` through the kernel's websocket; return the execute_result data, the
        stream text and the reply status."""
        ws = await self.ws_fetch("api", "kernels", kernel_id, "channels")
        msg_id = uuid.uuid4().hex
        request = {
            "header": {
                "msg_id": msg_id,
                "msg_type": "execute_request",
                "username": "test",
                "session": uuid.uuid4().hex,
                "version": "5.3",
                "date": "",
            },
            "parent_header": {},
            "metadata": {},
            "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
            "buffers": [],
        }
        result: dict[str, Any] = {"stream": "", "data": None, "status": None, "error": None}
        try:
            async with asyncio.timeout(timeout):
                await ws.write_message(json.dumps(request))
                while result["status"] is None or result["idle"] is not True:
                    raw = await ws.read_message()
                    if raw is None:
                        raise AssertionError("websocket closed")
                    msg = json.loads(raw)
                    if msg.get("parent_header", {}).get("msg_id") != msg_id:
                        continue
                    kind, content = msg["msg_type"], msg["content"]
                    if kind == "stream":
                        result["stream"] += content["text"]
                    elif kind == "execute_result":
                        result["data"] = content["data"].get("text/plain")
                    elif kind == "error":
                        result["error"] = content["ename"]
                    elif kind == "execute_reply":
                        result["status"] = content["status"]
                    elif kind == "status":
                        result["idle"] = content["execution_state"] == "idle"
                    result.setdefault("idle", False)
        finally:
            ws.close()
        return result


@pytest.fixture
def server(jp_fetch: Any, jp_ws_fetch: Any, jp_serverapp: Any) -> Server:
    return Server(jp_fetch, jp_ws_fetch, jp_serverapp)


async def _no_launchers() -> bool:
    return not launcher_pids()


def launcher_pids() -> set[int]:
    """Launcher processes that are children of this test process."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"kernel_queue.launcher" in cmdline:
            found.add(int(entry.name))
    return found
