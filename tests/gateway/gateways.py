"""Gateway servers (Kernel Gateway 3, Enterprise Gateway 3.x) as real subprocesses, for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from tests.kube.support import REPO
from tests.polling import NeverSaw, until

EG_ENV_SCRIPT = REPO / "scripts" / "enterprise-gateway-env"


def enterprise_gateway_python() -> Path:
    """The python of `.venv-eg` (built by scripts/enterprise-gateway-env when missing or stale)."""
    done = subprocess.run(
        [str(EG_ENV_SCRIPT)], capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the Enterprise Gateway environment failed:\n{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


def gateway_env(home: Path, **extra: str) -> dict[str, str]:
    """A gateway's environment: PATH, LANG and private Jupyter dirs under `home`; nothing of
    the test process's Jupyter or KERNEL_* settings."""
    env = {k: os.environ[k] for k in ("PATH", "LANG") if k in os.environ}
    env.update(
        HOME=str(home),
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTER_DATA_DIR=str(home / "data"),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class GatewayProcess:
    """One gateway server process; its output goes to `log_path`."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], port: int, log_path: Path):
        self.argv, self.env, self.port, self.log_path = list(argv), dict(env), port, log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def kernel_model(self, kernel: str) -> dict[str, Any]:
        """The kernel's model straight from the gateway's REST API."""
        response = await AsyncHTTPClient().fetch(f"{self.url}/api/kernels/{kernel}")
        return dict(json.loads(response.body))

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the process (its own session, output appended to the log)."""
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.process

    async def start(self, within: float = 60) -> None:
        """Start the server; return once `GET /api` answers."""
        process = self.spawn()
        client = AsyncHTTPClient()

        async def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"gateway exited {process.returncode}:\n{self.log()}")
            try:
                await client.fetch(f"{self.url}/api", request_timeout=2)
            except (OSError, HTTPClientError):
                return False
            return True

        await until(answering, f"the gateway at {self.url} answering", within=within, every=0.1)

    async def stop(self, sig: int = signal.SIGTERM, within: float = 30) -> int | None:
        """Send `sig` (SIGKILL: a crash) and wait for the process to end; its exit status."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        process.send_signal(sig)
        try:
            await until(lambda: process.poll() is not None, "the gateway exited", within=within)
        except NeverSaw:
            process.kill()
            process.wait()
        return process.returncode
