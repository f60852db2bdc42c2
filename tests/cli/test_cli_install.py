"""`jupyter kernel-queue install` as a user runs it: options it does not know, a queue or
priority class the backend lacks (the server's config for the local backend, the fake cluster's
LocalQueues and WorkloadPriorityClasses for the kubernetes one), and what it prints and writes."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import JUPYTER, kubeconfig_of, private_env, serving
from tests.conftest import KUEUE_DATA, skip_unless_ci

INSTALL = (JUPYTER, "kernel-queue", "install", "--user")
KUBE = ("--backend", "kubernetes", "--image", "registry.example/kernel:1")


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """Jupyter's user dirs and HOME private to the test; no kubeconfig."""
    env = {k: v for k, v in private_env(tmp_path).items() if not k.startswith("KUBE")}
    (tmp_path / "home").mkdir()
    (tmp_path / "config").mkdir()
    return env


def install(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INSTALL, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def written(env: dict[str, str], name: str = "python3-queued") -> dict[str, Any]:
    path = Path(env["JUPYTER_DATA_DIR"]) / "kernels" / name / "kernel.json"
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


def nothing_written(env: dict[str, str]) -> bool:
    return not (Path(env["JUPYTER_DATA_DIR"]) / "kernels").exists()


def test_a_typo_of_an_option_is_refused_with_the_option_it_meant(
    user_env: dict[str, str],
) -> None:
    done = install(user_env, "--gpu", "1")
    assert done.returncode == 2
    assert done.stderr == (
        "jupyter kernel-queue install: unknown option --gpu; did you mean --gpus? "
        "(`jupyter kernel-queue install --help` lists the options)\n"
    )
    assert done.stdout == ""
    assert nothing_written(user_env)
    stray = install(user_env, "gpu2")
    assert stray.returncode == 2
    assert "takes no arguments, only options, but was given 'gpu2'" in stray.stderr
    assert nothing_written(user_env)


def test_success_is_one_line_and_the_kernel_runs_with_this_interpreter(
    user_env: dict[str, str],
) -> None:
    done = install(user_env, "--name", "gpu2", "--gpus", "2", "--priority-class", "high")
    assert done.returncode == 0, done.stderr
    where = Path(user_env["JUPYTER_DATA_DIR"]) / "kernels" / "gpu2"
    assert done.stdout == f"Installed kernelspec gpu2 in {where}\n"
    assert done.stderr == ""
    spec = written(user_env, "gpu2")
    assert spec["argv"][0] == sys.executable
    assert Path(spec["argv"][0]).is_absolute()
    assert spec["display_name"] == "Python 3 (2 GPUs, queued in gpu)"
    again = install(user_env, "--name", "gpu2", "--gpus", "1", "--replace")
    assert (again.stdout, again.stderr) == (f"Installed kernelspec gpu2 in {where}\n", "")


def test_the_default_queue_is_the_shipped_kernelspecs_gpu_or_cpu(
    user_env: dict[str, str],
) -> None:
    assert install(user_env, "--name", "g").returncode == 0
    assert install(user_env, "--name", "c", "--gpus", "0").returncode == 0
    repo = Path(__file__).resolve().parents[2] / "kernelspecs"
    shipped_gpu = json.loads((repo / "python3-gpu-queued" / "kernel.json").read_text())
    shipped_cpu = json.loads((repo / "python3-cpu-queued" / "kernel.json").read_text())
    for name, shipped in (("g", shipped_gpu), ("c", shipped_cpu)):
        config = written(user_env, name)["metadata"]["kernel_provisioner"]["config"]
        assert config["queue"] == shipped["metadata"]["kernel_provisioner"]["config"]["queue"]
    assert written(user_env, "g")["display_name"] == "Python 3 (1 GPU, queued in gpu)"


def test_a_queue_or_class_the_local_backend_lacks_is_refused(user_env: dict[str, str]) -> None:
    done = install(user_env, "--queue", "nosuch")
    assert done.returncode == 2
    assert done.stderr == (
        "jupyter kernel-queue install: --queue 'nosuch' is not a queue of the local backend; "
        "its queues are default, gpu, cpu (the default of c.LocalBackend.queues; no Jupyter "
        "server config file sets it). Pass one of them, or add 'nosuch' to "
        "c.LocalBackend.queues in jupyter_server_config.py\n"
    )
    done = install(user_env, "--priority-class", "urgent")
    assert done.returncode == 2
    assert done.stderr.startswith(
        "jupyter kernel-queue install: --priority-class 'urgent' is not a priority class of "
        "the local backend; its classes are high (100), low (-100), normal (0)"
    )
    assert nothing_written(user_env)


def test_the_local_check_reads_the_servers_config_files(user_env: dict[str, str]) -> None:
    config = Path(user_env["JUPYTER_CONFIG_DIR"])
    (config / "jupyter_server_config.py").write_text('c.LocalBackend.queues = ["big", "small"]\n')
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"LocalBackend": {"priority_classes": {"urgent": 500}}})
    )
    done = install(user_env, "--queue", "gpu")
    assert done.returncode == 2
    assert "its queues are big, small (c.LocalBackend.queues as set in " in done.stderr
    assert str(config / "jupyter_server_config.py") in done.stderr
    done = install(user_env, "--queue", "big", "--priority-class", "urgent")
    assert done.returncode == 0, done.stderr
    config_written = written(user_env)["metadata"]["kernel_provisioner"]["config"]
    assert (config_written["queue"], config_written["priority_class"]) == ("big", "urgent")


def test_kubernetes_without_a_cluster_says_it_did_not_check(user_env: dict[str, str]) -> None:
    done = install(user_env, *KUBE, "--queue", "user-queue")
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "jupyter kernel-queue install: did not check --queue and --priority-class against a "
        "cluster: no kubeconfig at ~/.kube/config; set KUBECONFIG to the cluster's, then "
        "install again\n"
    )
    assert done.stdout.count("\n") == 1 and done.stdout.startswith("Installed kernelspec")
    assert written(user_env)["argv"][0] == "python"  # the pod's interpreter
    missing = install(user_env, *KUBE, "--replace")
    assert missing.returncode == 2
    assert "--queue is required for the kubernetes backend" in missing.stderr


@contextlib.contextmanager
def fake_cluster(directory: Path) -> Iterator[str]:
    """`jupyter kernel-queue fake-cluster --sample-queues` serving; yields its kubeconfig."""
    if not KUEUE_DATA.is_dir():
        skip_unless_ci(f"Kueue's CRDs are not at {KUEUE_DATA} (../shared is absent)")
    with serving("--sample-queues", f"--dir={directory}") as lines:
        yield kubeconfig_of(lines)


def test_kubernetes_checks_the_clusters_local_queues_and_priority_classes(
    user_env: dict[str, str], tmp_path: Path
) -> None:
    with fake_cluster(tmp_path / "cluster") as kubeconfig:
        env = {**user_env, "KUBECONFIG": kubeconfig}
        done = install(env, *KUBE, "--queue", "nosuch")
        assert done.returncode == 2
        assert done.stderr == (
            "jupyter kernel-queue install: --queue 'nosuch': no LocalQueue 'nosuch' in "
            f"namespace 'default' on the cluster of the kubeconfig {kubeconfig} ($KUBECONFIG) "
            "(LocalQueues in namespace 'default': user-queue). Pass one of them, or create it "
            "(see etc/kubernetes/queues.yaml)\n"
        )
        done = install(env, *KUBE, "--queue", "user-queue", "--priority-class", "urgent")
        assert done.returncode == 2
        assert "no WorkloadPriorityClass 'urgent'" in done.stderr
        assert "(WorkloadPriorityClasses: high, low)" in done.stderr
        assert nothing_written(env)
        done = install(env, *KUBE, "--queue", "user-queue", "--priority-class", "high")
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        assert done.stdout.endswith(
            "(LocalQueue 'user-queue' in namespace 'default' and WorkloadPriorityClass 'high' "
            f"found on the cluster of the kubeconfig {kubeconfig} ($KUBECONFIG))\n"
        )


def test_kubernetes_with_an_unreachable_cluster_says_it_did_not_check(
    user_env: dict[str, str], tmp_path: Path
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    done = install({**user_env, "KUBECONFIG": str(kubeconfig)}, *KUBE, "--queue", "q")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(
        "jupyter kernel-queue install: did not check --queue and --priority-class against the "
        f"cluster of the kubeconfig {kubeconfig} ($KUBECONFIG): it did not answer (get /apis: "
    ), done.stderr
    assert done.stderr.count("\n") == 1
    assert done.stdout.startswith("Installed kernelspec python3-queued in ")


def test_a_shared_install_is_readable_by_every_user_whatever_the_umask(
    user_env: dict[str, str], tmp_path: Path
) -> None:
    """Under --prefix (and --sys-prefix, the same with sys.prefix: root's install for every
    user) the kernelspec is 0755 and its kernel.json 0644, even under umask 077; it was 0700,
    so no other user's server listed it."""
    prefix = tmp_path / "prefix"
    args = [JUPYTER, "kernel-queue", "install", "--name", "shared", "--prefix", str(prefix)]
    folder = prefix / "share" / "jupyter" / "kernels" / "shared"
    done = subprocess.run(
        args,
        env=user_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.umask(0o077),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"Installed kernelspec shared in {folder}\n"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert stat.S_IMODE((folder / "kernel.json").stat().st_mode) == 0o644


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("--queue", ""),
            "--queue is empty: name the queue the kernel waits in, or leave --queue out for the "
            "default ('gpu' with GPUs, 'cpu' without)",
        ),
        (
            ("--admission-timeout", "nan"),
            "--admission-timeout must be 0 (wait forever) or a finite number of seconds, not nan",
        ),
        (
            (*KUBE, "--queue", "Bad Queue!"),
            "--queue 'Bad Queue!' is not a LocalQueue name Kubernetes accepts: use ",
        ),
        (
            (*KUBE, "--queue", "q", "--namespace", "Bad NS"),
            "--namespace 'Bad NS' is not a namespace name Kubernetes accepts: use ",
        ),
        (
            ("--backend", "kubernetes", "--queue", "q"),
            "--image is required for the kubernetes backend: pass the image the kernel runs in, "
            "one with Python and ipykernel (such as quay.io/jupyter/minimal-notebook)",
        ),
    ],
    ids=["empty-queue", "nan-timeout", "bad-queue", "bad-namespace", "no-image"],
)
def test_a_bad_option_is_a_sentence_naming_it_and_writes_nothing(
    user_env: dict[str, str], args: tuple[str, ...], said: str
) -> None:
    done = install(user_env, *args)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith(f"jupyter kernel-queue install: {said}"), done.stderr
    assert "Traceback" not in done.stderr
    assert nothing_written(user_env)


def test_a_display_name_that_is_not_utf8_is_refused(user_env: dict[str, str]) -> None:
    done = subprocess.run(
        [*(os.fsencode(a) for a in INSTALL), b"--display-name", b"caf\xe9"],
        env=user_env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert b"--display-name 'caf\\udce9' is not valid UTF-8 text; write it in UTF-8" in done.stderr
    assert nothing_written(user_env)


def test_a_prefix_nobody_can_write_is_a_sentence_not_a_traceback(
    user_env: dict[str, str], tmp_path: Path
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where a folder must go: no one, root included, writes there
    args = [JUPYTER, "kernel-queue", "install", "--prefix", str(blocked / "prefix")]
    done = subprocess.run(args, env=user_env, capture_output=True, text=True, timeout=120)
    where = blocked / "prefix" / "share" / "jupyter" / "kernels" / "python3-queued"
    assert done.returncode == 2
    # (after jupyter_client's own warning that the prefix is not where servers look)
    assert f"\njupyter kernel-queue install: could not write the kernelspec in {where}: " in (
        done.stderr
    ), done.stderr
    assert done.stderr.endswith(
        "; pick a place you can write (--user, or a --prefix of yours), or run as its owner\n"
    )
    assert "Traceback" not in done.stderr


def test_a_kernel_of_several_pods_is_installed_with_its_group_size(
    user_env: dict[str, str],
) -> None:
    done = install(user_env, *KUBE, "--queue", "q", "--pod-group-size", "2")
    assert done.returncode == 0, done.stderr
    spec = written(user_env)
    assert spec["metadata"]["kernel_provisioner"]["config"]["pod_group_size"] == 2
    assert spec["display_name"] == "Python 3 (2 pods of 1 GPU, queued in q)"
    local = install(user_env, "--pod-group-size", "2", "--name", "local2")
    assert local.returncode == 2
    assert "--pod-group-size is for the kubernetes backend" in local.stderr


def test_a_group_is_installed_with_the_command_its_workers_run(
    user_env: dict[str, str],
) -> None:
    line = "dask worker 'tcp://$(MASTER_ADDR):8786' --name 'w$(RANK)' --no-nanny"
    done = install(
        user_env, *KUBE, "--queue", "q", "--pod-group-size", "2", f"--worker-command={line}"
    )
    assert done.returncode == 0, done.stderr
    config = written(user_env)["metadata"]["kernel_provisioner"]["config"]
    assert config["worker_command"] == [
        "dask",
        "worker",
        "tcp://$(MASTER_ADDR):8786",
        "--name",
        "w$(RANK)",
        "--no-nanny",
    ]
    alone = install(user_env, *KUBE, "--queue", "q", "--name", "one", f"--worker-command={line}")
    assert alone.returncode == 2
    assert alone.stderr.endswith(
        "--worker-command is what each worker pod of a group runs, and this kernel has one pod: "
        "pass --pod-group-size 2 or more, or leave --worker-command out\n"
    )
    unsplit = install(
        user_env,
        *KUBE,
        "--queue",
        "q",
        "--pod-group-size",
        "2",
        "--name",
        "two",
        "--worker-command=dask 'worker",
    )
    assert unsplit.returncode == 2
    assert '--worker-command "dask \'worker" cannot be split into words' in unsplit.stderr
