"""`jupyter kernel-queue lab --fake-cluster`, run as a user runs it: JupyterLab on the kubernetes
backend against a fake cluster it starts, and stops (with everything it made) when JupyterLab
ends; what it says when the cluster cannot start; what `--help` lists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.cli_support import stop
from tests.conftest import KUEUE_CRDS, KUEUE_DATA, skip_unless_ci
from tests.polling import until_sync
from tests.ports import free_port as _free_port

JUPYTER = str(Path(sys.executable).parent / "jupyter")
TOKEN = "kernel-queue-test-token"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "CUDA_"))}
    env.update(
        HOME=str(tmp_path / "home"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        KERNEL_QUEUE_FAKE_CLUSTER_CRDS=str(KUEUE_CRDS),
        **extra,
    )
    return env


def _api(url: str, method: str = "GET", body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"token {TOKEN}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def _serving(base: str) -> bool:
    try:
        _api(base + "api/status")
    except (urllib.error.URLError, ConnectionError):
        return False
    return True


def test_lab_on_a_fake_cluster_runs_a_queued_kernel_there_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    if not KUEUE_DATA.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_DATA} (../shared is absent)")
    port = _free_port()
    base = f"http://127.0.0.1:{port}/"
    lab = subprocess.Popen(
        [
            JUPYTER,
            "kernel-queue",
            "lab",
            "--fake-cluster",
            "--no-browser",
            f"--port={port}",
            f"--IdentityProvider.token={TOKEN}",
            f"--notebook-dir={tmp_path}",
        ],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert lab.stdout is not None
        for line in lab.stdout:
            lines.append(line)
            if "to look inside: KUBECONFIG=" in line:
                break
        said = "".join(lines)
        assert "kernel-queue: the kubernetes backend uses the fake cluster at http://127." in said
        assert "'Python 3 (1 GPU, fake cluster)' and 'Python 3 (2 GPUs, high priority" in said
        kubeconfig = Path(said.split("KUBECONFIG=", 1)[1].split()[0])
        assert kubeconfig.is_file()
        until_sync(lambda: _serving(base), f"JupyterLab at {base} answering")
        specs = _api(base + "api/kernelspecs")["kernelspecs"]
        assert {"kq-fake-cluster-gpu", "kq-fake-cluster-2gpu-high"} <= set(specs)
        low = _api(base + "api/kernels", "POST", {"name": "kq-fake-cluster-gpu"})["id"]

        def running(kernel: str, preemptions: int = 0) -> dict[str, Any] | None:
            found = {k["id"]: k["queue"] or {} for k in _api(base + "api/kernel-queue/kernels")}
            queue = found[kernel]
            live = "resumed" if preemptions else "running"
            wanted = queue.get("state") == live and queue["preemptions"] == preemptions
            return queue if wanted else None

        queue = until_sync(lambda: running(low), "the kernel running on the fake cluster")
        assert (queue["backend"], queue["queue"], queue["gpus"]) == ("kubernetes", "user-queue", 1)
        # The 2-GPU high-priority kernel preempts it; once that one is shut down, it is back.
        high = _api(base + "api/kernels", "POST", {"name": "kq-fake-cluster-2gpu-high"})["id"]
        until_sync(lambda: running(high), "the high-priority kernel running")
        _api(base + f"api/kernels/{high}", "DELETE")
        back = until_sync(
            lambda: running(low, preemptions=1),
            "the preempted kernel back, running",
            detail=lambda: _api(base + "api/kernel-queue/kernels"),
        )
        assert back["message"].startswith("resumed; variables restored from the checkpoint")
    finally:
        stop(lab, signal.SIGTERM, within=90)
    assert lab.returncode == 0
    # The cluster kept its kubeconfig (and its pods' files) in its own directory: gone with it.
    assert not kubeconfig.parent.exists()


def test_lab_says_why_the_fake_cluster_did_not_start(tmp_path: Path) -> None:
    env = _env(tmp_path)
    del env["KERNEL_QUEUE_FAKE_CLUSTER_CRDS"]
    done = subprocess.run(
        [JUPYTER, "kernel-queue", "lab", "--fake-cluster", "--no-browser"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "jupyter kernel-queue lab: the fake cluster did not start; it said:" in done.stderr
    assert "The fake cluster needs Kueue's CRDs and none was given" in done.stderr


def test_lab_help_lists_its_own_options() -> None:
    done = subprocess.run(
        [JUPYTER, "kernel-queue", "lab", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for option in ("--pretend-gpus N", "--fake-cluster", "--kueue RELEASE"):
        assert option in done.stdout
