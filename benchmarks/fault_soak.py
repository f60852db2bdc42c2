"""Fault soak: 100 kernels through a real Jupyter server while the fake cluster injects ~80 API
faults; prints the kernels leaked, stuck and failed without a sentence (target: 0, 0, 0).

The fake cluster (API server, Kueue, kubelet) runs in this process; `jupyter server` runs as a
subprocess with the kubernetes backend pointed at it, driven over its REST API as a notebook
client would (kernel_queue_fake_cluster.soak). Also prints how many ERROR lines the server logged.
Usage: python benchmarks/fault_soak.py [--kernels 100] [--faults 80] [--parallel 6] [--seed 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from kernel_queue_fake_cluster import soak
from kernel_queue_fake_cluster.cluster import FakeCluster

from kernel_queue.cli.install import kernel_json


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Rest:
    """`soak.Jupyter` over a Jupyter server's REST API."""

    def __init__(self, http: aiohttp.ClientSession, url: str, token: str) -> None:
        self.http, self.url = http, url
        self.headers = {"Authorization": f"token {token}"}

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.http.request(
            method, self.url + path, json=body, headers=self.headers
        ) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None

    async def start(self, kernelspec: str) -> str:
        status, body = await self._call("POST", "/api/kernels", {"name": kernelspec})
        if status != 201:
            raise RuntimeError(f"POST /api/kernels answered {status}: {body}")
        return str(body["id"])

    async def entry(self, kernel_id: str) -> dict[str, Any]:
        _, listing = await self._call("GET", "/api/kernel-queue/kernels")
        return next((dict(k) for k in listing if k["id"] == kernel_id), {})

    async def delete(self, kernel_id: str) -> None:
        status, body = await self._call("DELETE", f"/api/kernels/{kernel_id}")
        if status not in (204, 404):
            raise RuntimeError(f"DELETE answered {status}: {body}")

    async def listed(self) -> set[str]:
        _, listing = await self._call("GET", "/api/kernels")
        return {k["id"] for k in listing}


async def main(kernels: int, faults: int, parallel: int, seed: int) -> int:
    with tempfile.TemporaryDirectory(prefix="kq-fault-soak-") as tmp:
        root = Path(tmp)
        cluster = FakeCluster(root_dir=root / "cluster")
        await cluster.start()
        cluster.setup_queues(quota={"cpu": 32, "memory": "128Gi", "nvidia.com/gpu": 3})
        spec = kernel_json(
            display_name="soak", backend="kubernetes", queue="user-queue", gpus=1, image="any"
        )
        (root / "data" / "kernels" / "soak").mkdir(parents=True)
        (root / "data" / "kernels" / "soak" / "kernel.json").write_text(json.dumps(spec))
        port, token = free_port(), secrets.token_hex(16)
        config = {
            "ServerApp": {
                "jpserver_extensions": {"kernel_queue": True},
                "port": port,
                "port_retries": 0,
                "open_browser": False,
                "root_dir": str(root),
                "allow_root": True,
            },
            "IdentityProvider": {"token": token},
            "KubernetesBackend": {
                "kubeconfig": str(cluster.kubeconfig),
                "namespace": "default",
                "position_interval": 0.5,
                "reap_interval": 2.0,
            },
        }
        (root / "config.json").write_text(json.dumps(config))
        env = {
            **os.environ,
            "JUPYTER_DATA_DIR": str(root / "data"),
            "JUPYTER_PATH": str(root / "data"),
            "JUPYTER_CONFIG_DIR": str(root / "config"),
            "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        }
        log_path = root / "server.log"
        with log_path.open("wb") as log:
            server = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "jupyter_server",
                f"--config={root / 'config.json'}",
                env=env,
                stdout=log,
                stderr=log,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(300):
                    try:
                        async with http.get(f"{url}/api/status?token={token}") as answer:
                            if answer.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
                else:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    raise SystemExit(f"the Jupyter server did not start:\n{tail}")
                report = await soak.soak(
                    cluster,
                    Rest(http, url, token),
                    "soak",
                    kernels=kernels,
                    parallel=parallel,
                    faults=faults,
                    seed=seed,
                )
        finally:
            if server.returncode is None:
                server.terminate()
            await server.wait()
            await cluster.stop()
        errors = [
            line
            for line in log_path.read_text(errors="replace").splitlines()
            if line.startswith("[E ")
        ]
    print(report.summary())
    print(f"leaked: {len(report.leaked)}")
    for kernel, left in report.leaked.items():
        print(f"  {kernel}: {left}")
    print(f"stuck: {len(report.stuck)}")
    for kernel, where in report.stuck.items():
        print(f"  {kernel}: {where}")
    print(f"unclear failures: {len(report.unclear)}")
    for kernel, reason in report.unclear.items():
        print(f"  {kernel}: {reason}")
    print(f"failures (each a sentence): {len(report.failed)}")
    for reason in sorted(set(report.failed.values())):
        print(f"  {reason[:160]}")
    print(f"server ERROR log lines: {len(errors)}")
    for line in errors[:10]:
        print(f"  {line[:160]}")
    return 0 if report.clean else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--faults", type=int, default=80)
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.kernels, args.faults, args.parallel, args.seed)))
