"""A Jupyter server killed with SIGKILL leaves no kernel process behind (its launchers get
SIGTERM from Linux), and the next server of the same user deletes the log and checkpoints the
dead one left, with an INFO line each, while it leaves a live server's alone."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from tests.conftest import KernelspecFactory, Server

JUPYTER = str(Path(sys.executable).parent / "jupyter")
TOKEN = "kernel-queue-reaper-test"


@pytest.fixture
def local_backend_config() -> dict[str, Any]:
    return {"gpus": [], "reap_interval": 0}  # look at every submit


def processes_of(kernel_id: str) -> set[int]:
    """Every process (any parent) whose environment names the kernel: launcher and kernel."""
    found = set()
    marker = f"KERNEL_ID={kernel_id}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


class OtherServer:
    """A second Jupyter server of the same user (same data and runtime dirs), as a process."""

    def __init__(self, root: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}/"
        self.output = (root / "other-server.log").open("wb")
        self.process = subprocess.Popen(
            [
                JUPYTER,
                "server",
                "--no-browser",
                "--allow-root",
                f"--port={port}",
                f"--IdentityProvider.token={TOKEN}",
                f"--ServerApp.root_dir={root}",
            ],
            env=dict(os.environ),  # pytest-jupyter's private Jupyter dirs
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )

    async def call(self, path: str, method: str = "GET", body: Any = None) -> Any:
        response = await AsyncHTTPClient().fetch(
            self.base + path,
            method=method,
            body=None if body is None else json.dumps(body),
            headers={"Authorization": f"token {TOKEN}"},
            request_timeout=20,
        )
        return json.loads(response.body or b"null")

    async def serving(self) -> bool:
        try:
            await self.call("api/status")
        except (OSError, HTTPClientError):
            return False
        return True

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.output.close()


async def test_a_killed_server_leaves_no_kernel_and_the_next_server_reaps_its_files(
    server: Server,
    kernelspec: KernelspecFactory,
    jp_data_dir: Path,
    jp_runtime_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = kernelspec("saving", gpus=0, checkpoint={"enabled": True})
    other = OtherServer(tmp_path)
    try:
        await server.wait_for(other.serving)
        kernel = (await other.call("api/kernels", "POST", {"name": name}))["id"]

        async def running() -> bool:
            listing = {k["id"]: k for k in await other.call("api/kernel-queue/kernels")}
            return bool((listing[kernel]["queue"] or {}).get("state") == "running")

        await server.wait_for(running)
        assert len(processes_of(kernel)) >= 2  # its launcher and the kernel
        record = jp_runtime_dir / "kernel-queue" / "kernels" / f"{kernel}.json"
        log = jp_runtime_dir / "kernel-queue" / f"kq-{kernel.replace('-', '')}.log"
        assert log.is_file()

        # This server looks, and leaves a live server's kernel alone.
        mine = await server.start_running(name)
        assert log.is_file()
        await server.shutdown_and_wait(mine)

        # The same id here would share that kernel's log and checkpoints: refused.
        body = json.dumps({"name": name, "kernel_id": kernel})
        await server.fetch("api", "kernels", method="POST", body=body)

        async def dead() -> bool:
            return bool((await server.model(kernel))["execution_state"] == "dead")

        await server.wait_for(dead)
        assert (await server.model(kernel))["reason"] == (
            f"kernel {kernel[:8]}: another Jupyter server of this user (pid "
            f"{other.process.pid}) runs a kernel with the id {kernel}, and the two would share "
            "its log and checkpoints; start the kernel without choosing an id."
        )
        assert log.is_file()
        await server.shutdown(kernel)
    finally:
        other.kill()

    async def no_processes() -> bool:
        return not processes_of(kernel)

    await server.wait_for(no_processes)
    checkpoints = jp_data_dir / "kernel-queue" / "checkpoints" / kernel
    assert checkpoints.is_dir()  # the kernel saved on its SIGTERM, as a preempted one does

    later = await server.start(name)
    assert (await server.execute(later, "2"))["data"] == "2"
    assert not checkpoints.exists() and not log.exists() and not record.exists()
    said = [m for r in caplog.records if "left by a server that is gone" in (m := r.getMessage())]
    assert said == [
        f"kernel {kernel}: removed checkpoints {checkpoints} left by a server that is gone",
        f"kernel {kernel}: removed log {log} left by a server that is gone",
    ]
    await server.shutdown_and_wait(later)


def test_the_state_folder_and_its_parent_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """`<runtime>/kernel-queue` was made 0755 as the parent of the records' folder."""
    from kernel_queue.backends.local import records

    state = tmp_path / "runtime" / "kernel-queue" / "kernels"
    server = records.Process.of(os.getpid())
    assert server is not None
    kernel_id = "1a2b3c4d-0000-4000-8000-00000000000a"
    old = os.umask(0o022)
    try:
        records.write(state, records.Record(kernel_id=kernel_id, server=server, log="x.log"))
    finally:
        os.umask(old)
    for folder in (state, state.parent):
        assert oct(folder.stat().st_mode & 0o777) == "0o700", folder
    assert oct((state / f"{kernel_id}.json").stat().st_mode & 0o777) == "0o600"
