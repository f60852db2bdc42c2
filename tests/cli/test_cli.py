"""`jupyter kernel-queue install | lab | status | park | resume`, run as a user runs them
(subprocesses)."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kernel_queue.backends.local import gpus as gpu_detection
from kernel_queue.cli.lab import inventory_message
from kernel_queue.cli.park import resolve
from kernel_queue.cli.status import StatusError
from tests.cli_support import JUPYTER, kernel_queue, lab_command, stop
from tests.conftest import KernelspecFactory, Server
from tests.polling import until_sync
from tests.ports import free_port as _free_port

KUBE = ["--backend", "kubernetes", "--image", "registry.example/kernel:1", "--queue", "q"]


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [JUPYTER, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_install_then_kernelspec_list_shows_the_new_kernelspec(user_env: dict[str, str]) -> None:
    done = run(
        user_env,
        "kernel-queue",
        "install",
        "--name",
        "gpu2",
        "--gpus",
        "2",
        "--queue",
        "gpu",
        "--priority-class",
        "high",
        "--user",
    )
    assert done.returncode == 0, done.stderr
    listed = run(user_env, "kernelspec", "list", "--json")
    specs = json.loads(listed.stdout)["kernelspecs"]
    assert specs["gpu2"]["spec"]["display_name"] == "Python 3 (2 GPUs, queued in gpu)"
    assert specs["gpu2"]["spec"]["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "kernel-queue",
        "config": {"backend": "local", "queue": "gpu", "gpus": 2, "priority_class": "high"},
    }
    assert specs["gpu2"]["spec"]["interrupt_mode"] == "message"


@pytest.mark.parametrize(
    ("args", "checkpoint"),
    [
        pytest.param(
            ["--checkpoint"], {"enabled": True}, id="on-with-the-servers-default-directory"
        ),
        pytest.param(
            ["--checkpoint-path", "/srv/ckpt", "--grace-seconds", "60", "--keep-checkpoints"],
            {"enabled": True, "path": "/srv/ckpt", "grace_seconds": 60, "keep": True},
            id="local-path-grace-keep",
        ),
        pytest.param(
            [*KUBE, "--checkpoint-claim", "ckpt", "--grace-seconds", "45.5"],
            {"enabled": True, "claim": "ckpt", "grace_seconds": 45.5},
            id="kubernetes-claim",
        ),
    ],
)
def test_install_writes_the_checkpoint_options(
    user_env: dict[str, str], args: list[str], checkpoint: dict[str, Any]
) -> None:
    done = run(user_env, "kernel-queue", "install", "--name", "ck", "--user", *args)
    assert done.returncode == 0, done.stderr
    spec = json.loads((Path(user_env["JUPYTER_DATA_DIR"]) / "kernels/ck/kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"]["checkpoint"] == checkpoint


def test_install_refuses_to_overwrite_without_replace(user_env: dict[str, str]) -> None:
    assert run(user_env, "kernel-queue", "install", "--name", "k", "--user").returncode == 0
    again = run(user_env, "kernel-queue", "install", "--name", "k", "--gpus", "3", "--user")
    assert again.returncode == 2
    assert "already exists" in again.stderr and "--replace" in again.stderr
    replaced = run(
        user_env, "kernel-queue", "install", "--name", "k", "--gpus", "3", "--user", "--replace"
    )
    assert replaced.returncode == 0, replaced.stderr
    spec = json.loads((Path(user_env["JUPYTER_DATA_DIR"]) / "kernels/k/kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"]["gpus"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--gpus", "-1"], "--gpus must be 0 or more, not -1", id="negative-gpus"),
        pytest.param(["--backend", "slurm"], "--backend must be one of", id="unknown-backend"),
        pytest.param(
            ["--backend", "kubernetes", "--queue", "q"],
            "--image is required",
            id="kubernetes-without-image",
        ),
        pytest.param(["--name", "My Kernel"], "is not a kernelspec name", id="bad-name"),
        pytest.param(["--memory", "lots"], "--memory: 'lots' is not a quantity", id="memory"),
        pytest.param(["--user", "--sys-prefix"], "at most one of", id="two-destinations"),
        pytest.param(
            ["--checkpoint-claim", "ckpt"],
            "--checkpoint-claim names a PersistentVolumeClaim, which only the kubernetes backend "
            "mounts; on the local backend use --checkpoint-path (a directory), or leave it out "
            "for the server's default",
            id="claim-on-local",
        ),
        pytest.param(
            [*KUBE, "--checkpoint-claim", "ckpt", "--checkpoint-path", "/srv/ckpt"],
            "--checkpoint-path is a directory of this machine, which a pod cannot reach; on the "
            "kubernetes backend name a PersistentVolumeClaim with --checkpoint-claim",
            id="path-on-kubernetes",
        ),
        pytest.param(
            [*KUBE, "--checkpoint"],
            "--checkpoint-claim is missing; name the PersistentVolumeClaim that holds checkpoints",
            id="kubernetes-checkpoint-without-claim",
        ),
        pytest.param(
            ["--checkpoint", "--grace-seconds", "3"],
            "--grace-seconds is 3, which leaves no time to save: the save must end 3 s before "
            "the kernel is stopped; use 4 or more seconds",
            id="local-grace-below-the-margin",
        ),
        pytest.param(
            [*KUBE, "--checkpoint-claim", "ckpt", "--grace-seconds", "8"],
            "--grace-seconds is 8, which leaves no time to save: the launcher stops the kernel "
            "5 s before the pod's grace period ends, and the save must end 3 s before that; use "
            "9 or more seconds",
            id="kubernetes-grace-below-the-margin",
        ),
        pytest.param(
            ["--checkpoint-path", "checkpoints"],
            "--checkpoint-path is 'checkpoints', a relative path; give an absolute directory",
            id="relative-path",
        ),
        pytest.param(
            ["--keep-checkpoints"],
            "--keep-checkpoints is true but checkpoints are off; turn them on with --checkpoint, "
            "or leave --keep-checkpoints out",
            id="keep-without-checkpoints",
        ),
        pytest.param(
            ["--checkpoint", "--grace-seconds", "nan"],
            "--grace-seconds is NaN; give a finite number of seconds",
            id="grace-nan",
        ),
    ],
)
def test_install_rejects_bad_options_and_writes_nothing(
    user_env: dict[str, str], args: list[str], message: str
) -> None:
    done = run(user_env, "kernel-queue", "install", "--user", *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (Path(user_env["JUPYTER_DATA_DIR"]) / "kernels").exists()


async def test_park_and_resume_a_kernel_by_the_short_id_status_prints(
    server: Server,
    kernelspec: KernelspecFactory,
    url: str,
    token: str,
    user_env: dict[str, str],
    tmp_path: Path,
) -> None:
    checkpoint = {"enabled": True, "path": str(tmp_path / "checkpoints"), "grace_seconds": 60}
    kernel = await server.start(kernelspec("saving", gpus=1, checkpoint=checkpoint))
    assert (await server.execute(kernel, "x = 41"))["status"] == "ok"
    plain = await server.start_running(kernelspec("plain", gpus=1))
    where = ["--url", url, "--token", token]
    short = kernel[:8]

    code, out, err = await kernel_queue(user_env, "park", short, *where)
    assert code == 0, err
    parking = f"kernel {short}: parking on request: saving its variables"
    parked = f"kernel {short}: parked on request; GPU released;"
    assert out.startswith((parking, parked)), out
    await server.wait_reason(kernel, "GPU released")
    code, out, err = await kernel_queue(user_env, "status", *where)
    row = next(line for line in out.splitlines() if line.startswith(short))
    assert row.split()[1:5] == ["-", "saving", "parked", "gpu"], row
    assert "parked on request; GPU released; your next cell brings it back" in row

    code, out, err = await kernel_queue(user_env, "resume", short, *where)
    assert code == 0, err
    assert out.startswith(f"kernel {short}: "), out
    assert (await server.execute(kernel, "x + 1"))["data"] == "42"
    code, out, err = await kernel_queue(user_env, "resume", short, *where)
    assert (code, out) == (0, f"kernel {short} is not parked (resumed): nothing to resume\n")

    # Errors are sentences: the server's reason, an unknown id, a wrong token, no server.
    code, out, err = await kernel_queue(user_env, "park", plain[:8], *where)
    assert code == 1
    assert err.startswith(f"jupyter kernel-queue park: kernel {plain[:8]} saves no checkpoints")
    code, out, err = await kernel_queue(user_env, "park", "zzzz", *where)
    assert (code, err) == (
        1,
        f"jupyter kernel-queue park: no kernel 'zzzz' on the server at {url}; "
        "`jupyter kernel-queue status` lists its kernels\n",
    )
    code, out, err = await kernel_queue(user_env, "resume", short, "--url", url, "--token", "x")
    assert code == 1
    assert err == (
        f"jupyter kernel-queue resume: the server at {url} rejected the token; pass --token "
        "(or set JUPYTER_TOKEN)\n"
    )
    gone = f"http://127.0.0.1:{_free_port()}/"
    code, out, err = await kernel_queue(user_env, "park", short, "--url", gone, "--token", "x")
    assert code == 1
    assert err == (
        f"jupyter kernel-queue park: no Jupyter server at {gone}; start one with `jupyter lab` "
        "or pass --url\n"
    )
    await server.shutdown_and_wait(kernel, plain)


def test_a_short_id_names_one_kernel_or_says_what_it_matches() -> None:
    listing = [{"id": "1a2b3c4d-0001"}, {"id": "1a2b3c4d-0002"}, {"id": "9f00aa00-0003"}]
    assert resolve(listing, "9f", "http://h/")["id"] == "9f00aa00-0003"
    assert resolve(listing, "1A2B3C4D-0002", "http://h/")["id"] == "1a2b3c4d-0002"
    with pytest.raises(StatusError) as ambiguous:
        resolve(listing, "1a2b", "http://h/")
    assert str(ambiguous.value) == (
        "2 kernels start with '1a2b' (1a2b3c4d-0001, 1a2b3c4d-0002); give more of the kernel's id"
    )


def _get(url: str, token: str, method: str = "GET", body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"token {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def _serving(base: str, token: str) -> bool:
    """Whether the server answers: its banner is printed before its listening socket is ready."""
    try:
        _get(base + "api/status", token)
    except OSError:
        return False
    return True


def test_the_lab_banner_names_the_gpus_found_or_the_visible_ones() -> None:
    """What the lab test sees of the banner depends on the machine; every case, here."""
    found = [gpu_detection.Gpu("0", "NVIDIA H200"), gpu_detection.Gpu("1", "NVIDIA H200")]
    after = (
        ". A kernel waits in the queue while the GPUs it asks for are in use; one asking for "
        "more than {} fails at once, saying so."
    )
    assert inventory_message(found, None, 1) == (
        "kernel-queue: 2 GPUs found: GPU 0 (NVIDIA H200), GPU 1 (NVIDIA H200)" + after.format(2)
    )
    assert inventory_message(found, "1", 1) == (
        "kernel-queue: CUDA_VISIBLE_DEVICES limits the queue to 1 GPU" + after.format(1)
    )
    assert inventory_message([], None, 3) == (
        "kernel-queue: no NVIDIA GPU found, so the local backend pretends to have 3 GPUs "
        "(--pretend-gpus N to change this)" + after.format(3)
    )


def test_lab_starts_jupyterlab_with_queued_kernelspecs_and_cleans_up(
    user_env: dict[str, str], tmp_path: Path
) -> None:
    port, token = _free_port(), "kernel-queue-test-token"
    env = {k: v for k, v in user_env.items() if not k.startswith("CUDA_")}
    gpus = gpu_detection.detect()
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[0].index  # a real GPU machine: queue on one of them
    two = run(env, "kernel-queue", "install", "--name", "two-gpus", "--gpus", "2", "--user")
    assert two.returncode == 0, two.stderr
    lab = subprocess.Popen(
        lab_command(port, token, f"--notebook-dir={tmp_path}"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}/"
    runtime = Path(user_env["JUPYTER_RUNTIME_DIR"])
    lines: list[str] = []
    try:
        assert lab.stdout is not None
        for line in lab.stdout:
            lines.append(line)
            if "is running at" in line or "http://127.0.0.1" in line:
                break
        until_sync(lambda: _serving(base, token), f"the server at {base} answering")
        banner = lines[0]
        if gpus:
            assert banner.startswith(
                "kernel-queue: CUDA_VISIBLE_DEVICES limits the queue to 1 GPU."
            )
        else:
            assert banner.startswith(
                "kernel-queue: no NVIDIA GPU found, so the local backend pretends to have 1 GPU "
            )
        specs = _get(base + "api/kernelspecs", token)["kernelspecs"]
        assert {"python3-gpu-queued", "python3-cpu-queued"} <= set(specs)
        first = _get(base + "api/kernels", token, "POST", {"name": "python3-gpu-queued"})["id"]
        second = _get(base + "api/kernels", token, "POST", {"name": "python3-gpu-queued"})["id"]

        # With 1 GPU (pretend, or the one CUDA_VISIBLE_DEVICES leaves) the second kernel waits.
        def second_placed() -> dict[str, Any] | None:
            listing = {k["id"]: k for k in _get(base + "api/kernel-queue/kernels", token)}
            return listing if (listing[second]["queue"] or {}).get("position") == 1 else None

        listing = until_sync(second_placed, "the second kernel placed at position 1")
        assert listing[second]["queue"]["state"] == "queued"
        assert listing[second]["queue"]["message"] == (
            "queued in 'gpu', position 1 of 1, needs 1 GPU"
        )
        assert listing[first]["queue"]["state"] in ("admitted", "running")
        # The running kernel's connection file exists now, so its absence below means clean-up.
        connection_file = runtime / f"kernel-{first}.json"
        until_sync(connection_file.exists, f"the running kernel's {connection_file.name}")

        # As the banner says: a kernel asking for more GPUs than there are fails at once.
        assert "one asking for more than 1 fails at once, saying so." in banner
        big = _get(base + "api/kernels", token, "POST", {"name": "two-gpus"})["id"]

        def failed() -> dict[str, Any] | None:
            model = _get(base + f"api/kernels/{big}", token)
            return model if model["execution_state"] == "dead" else None

        model = until_sync(failed, "the 2-GPU kernel failed", within=15)
        assert "asks for 2 GPU(s) but this machine has 1" in model["reason"]
        assert "so it could never start" in model["reason"]
    finally:
        stop(lab, signal.SIGTERM, within=60)
    leftovers = [p.name for p in runtime.rglob("*") if p.name.startswith(("kernel-", "kq-"))]
    assert [p for p in leftovers if p != "kernel-queue"] == []
