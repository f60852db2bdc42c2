"""The node agent as its own process (`python -m kernel_queue_fake_cluster.node`) against a
FakeCluster started in a thread with no agent of its own, reached through the cluster's
kubeconfig (a bearer token, RBAC on): it registers its Node, binds and runs pods, serves their
logs at its kubelet endpoint over HTTPS, deletes them gracefully, and on SIGTERM leaves no
process and none of its files behind but the claims'."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kernel_queue_fake_cluster.apiserver import rbac
from kernel_queue_fake_cluster.apiserver.errors import ApiError
from kernel_queue_fake_cluster.apiserver.kinds import Obj
from kernel_queue_fake_cluster.cluster import FakeCluster

NS = "default"
NODE = "proc-node"
T = TypeVar("T")

LINGER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a grandchild
    open(os.path.join(os.environ["DATA"], "kept"), "w").write("claim data")
    print("started", os.environ["POD_IP"], flush=True)
    time.sleep(600)
    """
)


def until(check: Callable[[], T], what: str, within: float = 30.0) -> T:
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    """A FakeCluster in a thread, RBAC on (the kubeconfig carries an admin's token), no agent."""
    admins = {"admin-token": rbac.User("admin", (rbac.SUPERUSER_GROUP,))}
    cluster = FakeCluster(root_dir=tmp_path / "cluster", kubelet=False, kueue=False, tokens=admins)
    cluster.start_in_thread()
    try:
        yield cluster
    finally:
        cluster.stop_in_thread()


def start_agent(fake: FakeCluster, root: Path) -> tuple[subprocess.Popen[str], int]:
    """The agent process, once it says it is ready; and its kubelet port."""
    argv = [sys.executable, "-m", "kernel_queue_fake_cluster.node", "--kubeconfig"]
    argv += [str(fake.kubeconfig), "--node-name", NODE, "--root", str(root), "--bind"]
    argv += ["--gpus", "2", "--cpu", "4", "--memory", "8Gi"]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    with concurrent.futures.ThreadPoolExecutor(1) as reader:
        try:
            line = reader.submit(process.stdout.readline).result(timeout=60)  # type: ignore[union-attr]
        except concurrent.futures.TimeoutError:
            process.kill()
            pytest.fail("the agent never said it was ready")
    if not line.startswith(f"node agent {NODE} ready"):
        process.kill()
        pytest.fail(f"the agent said {line!r}; stderr: {process.stderr.read()}")  # type: ignore[union-attr]
    return process, int(line.rsplit(" ", 1)[1].rstrip(")\n"))


def get(fake: FakeCluster, plural: str, name: str, namespace: str | None = NS) -> Obj | None:
    try:
        return fake.call(fake.store.get, "", plural, namespace, name)
    except ApiError:
        return None


def pod(name: str, code: str, **spec: Any) -> Obj:
    container = {
        "name": "main",
        "image": "python:3.11",
        "command": ["python", "-c", code],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "DATA", "value": "/data"},
        ],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    body = {"containers": [container], "volumes": volumes, "restartPolicy": "Never", **spec}
    return {"metadata": {"name": name}, "spec": body}


def kubelet_logs(port: int, name: str, query: str = "") -> str:
    """GET /containerLogs over HTTPS, as the API server proxies `kubectl logs` (unverified)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    url = f"https://127.0.0.1:{port}/containerLogs/{NS}/{name}/main{query}"
    with urllib.request.urlopen(url, context=context, timeout=10) as answer:
        return str(answer.read().decode())


def session_members(session: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z" and int(fields[3]) == session:
                    found.append(int(entry))
    return found


def test_the_agent_process_registers_runs_serves_logs_and_leaves_nothing_on_sigterm(
    fake: FakeCluster, tmp_path: Path
) -> None:
    root = tmp_path / "node"
    process, port = start_agent(fake, root)
    try:
        node = get(fake, "nodes", NODE, None)
        assert node is not None
        status = node["status"]
        assert status["capacity"] == status["allocatable"]
        assert {k: status["capacity"][k] for k in ("cpu", "memory", "nvidia.com/gpu")} == {
            "cpu": "4",
            "memory": "8Gi",
            "nvidia.com/gpu": "2",
        }
        assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == port > 0
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"

        claim = {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}
        fake.call(fake.store.create, "", "persistentvolumeclaims", NS, claim)
        fake.call(fake.store.create, "", "pods", NS, pod("lingers", LINGER))
        fake.call(fake.store.create, "", "pods", NS, pod("quick", "print('quick')"))

        def running() -> Obj | None:
            found = get(fake, "pods", "lingers")
            return found if found and found["status"].get("phase") == "Running" else None

        found = until(running, "lingers Running")
        assert found["spec"]["nodeName"] == NODE
        ip = found["status"]["podIP"]
        text = until(lambda: "started" in (t := kubelet_logs(port, "lingers")) and t, "its log")
        assert text == f"started {ip}\n"
        assert kubelet_logs(port, "lingers", "?tailLines=0") == ""
        pid = int(found["status"]["containerStatuses"][0]["containerID"].removeprefix("fake://"))
        assert len(session_members(pid)) == 2  # the container and its grandchild

        def succeeded() -> Obj | None:
            found = get(fake, "pods", "quick")
            return found if found and found["status"].get("phase") == "Succeeded" else None

        done = until(succeeded, "quick Succeeded")
        assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
        fake.call(fake.store.delete, "", "pods", NS, "quick")  # finished: it goes at once
        assert get(fake, "pods", "quick") is None

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, process.stderr.read()  # type: ignore[union-attr]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()

    until(lambda: session_members(pid) == [], "no process of the pod's session", within=10)
    assert sorted(p.name for p in root.iterdir()) == ["pvc"]  # no pods/, no tls/
    assert (root / "pvc" / NS / "data" / "kept").read_text() == "claim data"
    kept = get(fake, "pods", "lingers")  # a stopped agent deletes nothing: a kubelet's way
    assert kept is not None and kept["status"]["phase"] == "Running"
    assert json.loads(json.dumps(kept))["spec"]["nodeName"] == NODE
