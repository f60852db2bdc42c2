"""`jupyter kernel-queue fake-cluster` as a user runs it, and its sample queues, which are
etc/kubernetes/queues.yaml."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests.conftest import KUEUE_DATA, skip_unless_ci

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"


def _wait(check: Any, *, within: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_fake_cluster_command_serves_kueue_with_sample_queues(tmp_path: Path) -> None:
    if not KUEUE_DATA.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_DATA} (../shared is absent)")
    jupyter = str(Path(sys.executable).parent / "jupyter")
    process = subprocess.Popen(
        [jupyter, "kernel-queue", "fake-cluster", "--sample-queues", f"--dir={tmp_path / 'c'}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("kubeconfig: "):
                break
        kubeconfig = lines[-1].split(": ", 1)[1].strip()
        assert lines[0].startswith("Fake Kubernetes API server with Kueue at http://127.0.0.1:")
        api = config.new_client_from_config(config_file=kubeconfig)
        queues = client.CustomObjectsApi(api).list_namespaced_custom_object(
            GROUP, VERSION, "default", "localqueues"
        )
        assert [q["metadata"]["name"] for q in queues["items"]] == ["user-queue"]
        pod = {
            "metadata": {"name": "hello", "labels": {"kueue.x-k8s.io/queue-name": "user-queue"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "python",
                        "command": ["python", "-c", "print('hi from a pod')"],
                        "resources": {"requests": {"cpu": "1"}},
                    }
                ],
            },
        }
        core = client.CoreV1Api(api)
        core.create_namespaced_pod("default", pod)
        _wait(
            lambda: core.read_namespaced_pod("hello", "default").status.phase == "Succeeded",
            what="the pod to run",
        )
        assert core.read_namespaced_pod_log("hello", "default").strip() == "hi from a pod"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert process.returncode == 0


def test_fake_cluster_sample_queues_are_etc_kubernetes_queues() -> None:
    from kernel_queue.cli.fake_cluster import sample_queue_objects

    shipped = Path(__file__).resolve().parents[1] / "etc" / "kubernetes" / "queues.yaml"
    assert list(yaml.safe_load_all(shipped.read_text())) == sample_queue_objects()
