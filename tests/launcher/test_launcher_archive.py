"""The launcher archive the server delivers: what it holds, its ConfigMap, the pods that run it,
and the archive itself run by interpreters that lack kernel-queue (and ipykernel)."""

from __future__ import annotations

import ast
import base64
import io
import re
import signal
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

from jupyter_client.blocking import BlockingKernelClient

from kernel_queue.kube.objects import launcher_archive, manifests
from kernel_queue.launcher import settings
from tests.commands import ran
from tests.kube import images
from tests.kube_pieces.specs import GROUP, SPEC
from tests.ports import free_port

ALLOWED = {"ipykernel", "IPython", "traitlets", "zmq", "dill", "numpy", "blake3"}
"""Libraries the archive's own modules may import besides the stdlib and each other: what every
image with ipykernel has, and the checkpoint libraries (dill bundled, numpy and blake3 optional)."""
OURS = ("kernel_queue.launcher", "kernel_queue.checkpoint", "kernel_queue.errors")


def test_the_archive_is_small_deterministic_and_named_for_its_version_and_bytes() -> None:
    first, second = launcher_archive.build(), launcher_archive.build()
    assert first.data == second.data
    assert re.fullmatch(r"kq-launcher-0\.1\.0-[0-9a-f]{12}", first.name)
    assert first.name.endswith(first.digest[:12])
    print(f"launcher archive: {len(first.data)} bytes, bundling {first.bundled}")
    assert len(first.data) < launcher_archive.LIMIT // 2  # room to grow under ConfigMap's 1 MiB
    names = zipfile.ZipFile(io.BytesIO(first.data)).namelist()
    assert "__main__.py" in names
    assert "kernel_queue/launcher/kernel.py" in names
    assert "kernel_queue/checkpoint/snapshot.py" in names
    assert "_fallback/dill/__init__.py" in names
    assert not [n for n in names if "/tests/" in n or n.startswith("kernel_queue/kube")]


def test_the_archive_imports_only_the_stdlib_ipykernel_and_the_checkpoint_libraries() -> None:
    found = launcher_archive.build()
    archive = zipfile.ZipFile(io.BytesIO(found.data))
    imported: dict[str, set[str]] = {}
    for name in archive.namelist():
        if not name.startswith("kernel_queue/") or not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(archive.read(name))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                imported.setdefault(module, set()).add(name)
    outside = {
        module: where
        for module, where in imported.items()
        if module.split(".")[0] not in sys.stdlib_module_names
        and module.split(".")[0] not in ALLOWED
        and module not in ("kernel_queue", "kernel_queue._version", *OURS)
        and not module.startswith(tuple(f"{o}." for o in OURS))
        and module != "__future__"
    }
    assert outside == {}


BARE = {"PATH": "/usr/bin:/bin"}
IMPORTS = (
    "import kernel_queue.launcher.kernel as k, kernel_queue.checkpoint.snapshot as s; "
    "print(k.__file__, s.__file__)"
)


def test_this_python_imports_the_archives_bytecode_and_another_compiles_its_sources(
    tmp_path: Path,
) -> None:
    """Every module has its .pyc beside it, which this Python's zipimport loads instead of
    compiling the source at each pod start; an archive whose bytecode's magic number is not the
    interpreter's (an image of another Python) still runs, from the sources."""
    data = launcher_archive.build().data
    names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
    sources = {n for n in names if n.endswith(".py")}
    assert {f"{n}c" for n in sources} <= names
    assert len(names) == 2 * len(sources)
    ours = tmp_path / "ours.pyz"
    ours.write_bytes(data)
    loaded = ran(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(ours)!r}); {IMPORTS}"],
        env=BARE,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert [Path(f).suffix for f in loaded.stdout.split()] == [".pyc", ".pyc"]
    other = tmp_path / "other.pyz"
    with (
        zipfile.ZipFile(io.BytesIO(data)) as source,
        zipfile.ZipFile(other, "w", zipfile.ZIP_DEFLATED) as out,
    ):
        for info in source.infolist():
            body = source.read(info)
            out.writestr(
                info, b"\x00\x00\r\n" + body[4:] if info.filename.endswith(".pyc") else body
            )
    compiled = ran(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(other)!r}); {IMPORTS}"],
        env=BARE,
    )
    assert compiled.returncode == 0, compiled.stderr
    assert [Path(f).suffix for f in compiled.stdout.split()] == [".py", ".py"]


def test_the_config_map_is_immutable_labelled_ours_and_holds_the_archive() -> None:
    found = launcher_archive.build()
    body = launcher_archive.configmap(found, "team-a")
    assert body["metadata"] == {
        "name": found.name,
        "namespace": "team-a",
        "labels": {
            "app.kubernetes.io/managed-by": "kernel-queue",
            "app.kubernetes.io/component": "launcher",
        },
        "annotations": {
            "kernel-queue.dev/launcher-digest": f"sha256:{found.digest}",
            "kernel-queue.dev/launcher-version": "0.1.0",
        },
    }
    assert body["immutable"] is True
    assert base64.b64decode(body["binaryData"]["launcher.pyz"]) == found.data
    assert launcher_archive.holds(body, found)
    assert not launcher_archive.holds({"binaryData": {"launcher.pyz": "AAAA"}}, found)


def test_every_pod_of_a_group_runs_the_delivered_archive_mounted_read_only() -> None:
    head, worker = manifests.pods(
        replace(SPEC, pod_group_size=2), GROUP, 0, launcher="kq-launcher-0.1.0-0123456789ab"
    )
    volume = {
        "name": "kernel-queue-launcher",
        "configMap": {
            "name": "kq-launcher-0.1.0-0123456789ab",
            "items": [{"key": "launcher.pyz", "path": "launcher.pyz"}],
            "defaultMode": 0o444,
        },
    }
    mount = {
        "name": "kernel-queue-launcher",
        "mountPath": "/var/lib/kernel-queue/launcher",
        "readOnly": True,
    }
    for pod, command in (
        (head, ["python", "/var/lib/kernel-queue/launcher/launcher.pyz"]),
        (worker, ["python", "/var/lib/kernel-queue/launcher/launcher.pyz", "--worker"]),
    ):
        assert pod["spec"]["volumes"] == [volume]
        (container,) = pod["spec"]["containers"]
        assert container["command"] == command
        assert container["volumeMounts"] == [mount]
    assert head["spec"]["containers"][0]["args"][0] == "--"  # the kernel's argv is unchanged


def run_archive(python: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "launcher.pyz"
    path.write_bytes(launcher_archive.build().data)
    message = tmp_path / "termination-log"
    message.touch()
    env = {"KERNEL_QUEUE_LAUNCH_TERMINATION_LOG": str(message), "PATH": "/usr/bin:/bin"}
    return ran([python, "-I", str(path), *args], env=env, cwd=tmp_path)


def test_an_interpreter_without_ipykernel_is_told_in_one_line_and_the_termination_message(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "python-only"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = run_archive(str(venv / "bin" / "python"), tmp_path, "--ports", "1,2,3,4,5")
    assert done.returncode == 3
    line = f"no module named ipykernel in {venv / 'bin' / 'python'} (Python "
    assert line in done.stderr
    assert (tmp_path / "termination-log").read_text().startswith(line)


def test_the_archive_runs_the_launcher_of_this_checkout_where_kernel_queue_is_absent(
    tmp_path: Path,
) -> None:
    """Under `-I` nothing of this checkout is importable but what the archive holds."""
    done = run_archive(sys.executable, tmp_path, "--ports", "1,2,3,4,5")
    assert done.returncode == 2  # a usage error of the launcher itself: no key given
    assert "no connection key" in done.stderr


def test_without_dill_a_kernel_runs_and_its_preemption_says_what_the_image_lacks(
    tmp_path: Path,
) -> None:
    """A server without dill delivers an archive without it; in an image without it too the
    kernel runs with checkpoints off, and the termination message after SIGTERM says why."""
    python = images.bare_kernel_bin() / "python"
    archive = tmp_path / "launcher.pyz"
    archive.write_bytes(launcher_archive.build(libraries=()).data)
    message = tmp_path / "termination-log"
    message.touch()
    ports = [free_port() for _ in range(5)]
    env = {
        "PATH": "/usr/bin:/bin",
        "KERNEL_QUEUE_LAUNCH_IP": "127.0.0.1",
        "KERNEL_QUEUE_LAUNCH_PORTS": ",".join(map(str, ports)),
        "KERNEL_QUEUE_LAUNCH_KEY": "a-key",
        "KERNEL_QUEUE_LAUNCH_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "KERNEL_QUEUE_LAUNCH_TERMINATION_LOG": str(message),
    }
    proc = subprocess.Popen([str(python), "-I", str(archive)], env=env, cwd=tmp_path)
    client = BlockingKernelClient()
    try:
        client.load_connection_info(
            {
                "ip": "127.0.0.1",
                "key": "a-key",
                "transport": "tcp",
                "signature_scheme": "hmac-sha256",
                **dict(
                    zip(
                        ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"),
                        ports,
                        strict=True,
                    )
                ),
            }
        )
        client.start_channels(hb=False)
        client.wait_for_ready(timeout=60)
        reply = client.execute_interactive("x = 6 * 7", timeout=60)
        assert reply["content"]["status"] == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        client.stop_channels()
        proc.kill()
        proc.wait()
    assert message.read_text() == (
        "checkpoint not saved: the kernel's image has no dill, which checkpoints need, so a "
        "preemption loses the kernel's variables; add dill to the image (pip install dill)"
    )


def test_the_kernelspecs_kernel_module_runs_from_the_archive_and_other_commands_stay() -> None:
    kernelspec = ("python", "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}")
    where = "/var/lib/kernel-queue/launcher/launcher.pyz"
    assert settings.from_archive(kernelspec, where) == (
        "python",
        where,
        "kernel",
        "-f",
        "{connection_file}",
    )
    assert settings.from_archive(kernelspec, None) == kernelspec  # installed: unchanged
    other = ("python", "-m", "ipykernel_launcher", "-f", "{connection_file}")
    assert settings.from_archive(other, where) == other
