"""The product's doors to the fake cluster (a distribution of its own): `jupyter kernel-queue
fake-cluster` as a user runs it, its sample queues (etc/kubernetes/queues.yaml), what it says
without Kueue's CRDs, and the `kernel_queue.testing` compatibility shim."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kernel_queue_fake_cluster.apiserver import crds as crd_files
from kubernetes import client, config

from tests.cli_support import kubeconfig_of, serving
from tests.conftest import KUEUE_DATA, skip_unless_ci
from tests.polling import until_sync

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"


def test_the_printed_kubectl_apply_of_the_sample_queues_works(tmp_path: Path) -> None:
    """The banner's command, as printed (validation on), creates the sample queues."""
    if not KUEUE_DATA.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_DATA} (../shared is absent)")
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is not installed: this test runs the printed command"
    with serving(f"--dir={tmp_path / 'c'}") as lines:
        [command] = [line.split() for line in lines if line.strip().startswith("kubectl apply")]
        assert command == ["kubectl", "apply", "-f", str(tmp_path / "c" / "sample-queues.yaml")]
        env = {**os.environ, "KUBECONFIG": kubeconfig_of(lines)}
        done = subprocess.run(
            [kubectl, *command[1:]], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert "localqueue.kueue.x-k8s.io/user-queue created" in done.stdout


def test_fake_cluster_command_serves_kueue_with_sample_queues(tmp_path: Path) -> None:
    if not KUEUE_DATA.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_DATA} (../shared is absent)")
    with serving("--sample-queues", f"--dir={tmp_path / 'c'}") as lines:
        kubeconfig = kubeconfig_of(lines)
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
        until_sync(
            lambda: core.read_namespaced_pod("hello", "default").status.phase == "Succeeded",
            "the pod run to its end",
        )
        assert core.read_namespaced_pod_log("hello", "default").strip() == "hi from a pod"


def test_fake_cluster_sample_queues_are_etc_kubernetes_queues() -> None:
    from kernel_queue.cli.fake_cluster import sample_queue_objects

    shipped = Path(__file__).resolve().parents[2] / "etc" / "kubernetes" / "queues.yaml"
    assert list(yaml.safe_load_all(shipped.read_text())) == sample_queue_objects()


def fake_cluster_command(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the command to its end, without $KERNEL_QUEUE_FAKE_CLUSTER_CRDS unless in `env`."""
    environ = {k: v for k, v in os.environ.items() if k != crd_files.ENVIRONMENT_VARIABLE}
    jupyter = str(Path(sys.executable).parent / "jupyter")
    return subprocess.run(
        [jupyter, "kernel-queue", "fake-cluster", *args],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_fake_cluster_command_without_crds_says_how_to_give_them(tmp_path: Path) -> None:
    result = fake_cluster_command(f"--dir={tmp_path / 'c'}")
    assert result.returncode == 2
    assert result.stderr.startswith(
        "jupyter kernel-queue fake-cluster: The fake cluster needs Kueue's CRDs and none was "
        "given: pass crds=PATH (--crds PATH to `jupyter kernel-queue fake-cluster`), or set "
        "KERNEL_QUEUE_FAKE_CLUSTER_CRDS, to a directory of Kueue's CRD files or to Kueue's "
        "release manifests.yaml (https://github.com/kubernetes-sigs/kueue/releases/download/"
    )
    assert not (tmp_path / "c").exists()


def test_fake_cluster_command_names_a_missing_crds_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = fake_cluster_command(f"--crds={missing}")
    assert result.returncode == 2
    assert f"No Kueue CRDs at {missing} (from crds): pass crds=PATH" in result.stderr


def test_kernel_queue_testing_is_the_fake_cluster_when_it_is_installed() -> None:
    import kernel_queue_fake_cluster.plugin
    from kernel_queue_fake_cluster.cluster import FakeCluster

    import kernel_queue.testing
    import kernel_queue.testing.plugin

    assert kernel_queue.testing.FakeCluster is FakeCluster
    assert kernel_queue.testing.plugin.fake_cluster is kernel_queue_fake_cluster.plugin.fake_cluster


def test_kernel_queue_testing_says_how_to_install_a_missing_fake_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kernel_queue.testing

    for name in [n for n in sys.modules if n.split(".")[0] == "kernel_queue_fake_cluster"]:
        monkeypatch.delitem(sys.modules, name)
    unfound = [p for p in sys.path if not (Path(p) / "kernel_queue_fake_cluster").is_dir()]
    monkeypatch.setattr(sys, "path", unfound)  # as if it were not installed
    with pytest.raises(ImportError) as caught:
        kernel_queue.testing.FakeCluster  # noqa: B018
    assert str(caught.value) == (
        "the fake cluster is a distribution of its own, kernel-queue-fake-cluster, which is not "
        "installed; from a checkout of kernel-queue: pip install ./packages/fake-cluster"
    )


def test_fake_cluster_command_is_the_kueue_release_asked_for(tmp_path: Path) -> None:
    """`--kueue 0.14` on 0.14's CRDs serves kueue.x-k8s.io/v1beta1 only, its sample queues
    at that version; discovery lists that version alone."""
    v014 = KUEUE_DATA / "v0.14" / "crds"
    if not v014.is_dir():
        skip_unless_ci(f"Kueue 0.14's CRDs are not at {v014} (../shared is absent)")
    release = ("--kueue=0.14", f"--crds={v014}", "--sample-queues", f"--dir={tmp_path / 'c'}")
    with serving(*release) as lines:
        assert lines[1] == (
            "Kueue 0.14: kueue.x-k8s.io v1beta1, visibility.kueue.x-k8s.io v1beta1\n"
        )
        api = config.new_client_from_config(config_file=kubeconfig_of(lines))
        custom = client.CustomObjectsApi(api)
        queues = custom.list_namespaced_custom_object(GROUP, "v1beta1", "default", "localqueues")
        assert [q["apiVersion"] for q in queues["items"]] == [f"{GROUP}/v1beta1"]
        groups = client.ApisApi(api).get_api_versions().groups
        kueue = next(g for g in groups if g.name == GROUP)
        assert [v.version for v in kueue.versions] == ["v1beta1"]
        written = list(yaml.safe_load_all((tmp_path / "c" / "sample-queues.yaml").read_text()))
        assert {doc["apiVersion"] for doc in written} == {f"{GROUP}/v1beta1"}


def test_fake_cluster_command_refuses_crds_of_another_release(tmp_path: Path) -> None:
    if not KUEUE_DATA.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_DATA} (../shared is absent)")
    crds = KUEUE_DATA / "crds"
    result = fake_cluster_command("--kueue=0.14", f"--crds={crds}", f"--dir={tmp_path / 'c'}")
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"jupyter kernel-queue fake-cluster: The Kueue CRDs at {crds} serve ClusterQueue at "
        "v1beta1 and v1beta2 (storage v1beta2), but Kueue 0.14 serves v1beta1 only (storage "
        "v1beta1): give Kueue 0.13's or 0.14's CRDs"
    )
    result = fake_cluster_command("--kueue=0.15", f"--crds={crds}")
    assert result.returncode == 2
    assert "does not emulate Kueue '0.15': choose one of 0.14, 0.19, 0.20" in result.stderr
    assert not (tmp_path / "c").exists()
