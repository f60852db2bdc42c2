"""Bad kernelspec config fails the kernel with a sentence naming the fix, and leaves nothing."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KernelspecFactory, Server, launcher_pids


async def _failure(server: Server, name: str) -> dict[str, Any]:
    _, model = await server.failure(name)
    assert launcher_pids() == set()
    return model


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param({"gpus": -1}, "`gpus` is -1; ask for 0 or more GPUs", id="negative-gpus"),
        pytest.param(
            {"gpus": 3},
            "asks for 3 GPU(s) but this machine has 2 GPU(s) in all, so it could never start",
            id="more-gpus-than-the-machine",
        ),
        pytest.param(
            {"backend": "slurm"},
            "`backend` is 'slurm', which is not a backend; set it to one of 'local', 'kubernetes'",
            id="unknown-backend",
        ),
        pytest.param(
            {"queue": "nope"},
            "queue 'nope' does not exist on the local backend; known queues: default, gpu, cpu",
            id="unknown-queue",
        ),
        pytest.param(
            {"gpus": "1"},
            "kernelspec config key 'gpus' must be a whole number such as 1, not '1' (a string); "
            'write "gpus": 1 without quotes in kernel.json',
            id="gpus-as-a-string",
        ),
        pytest.param(
            {"priority_class": "urgent"},
            "priority class 'urgent' does not exist; known classes: high, low, normal",
            id="unknown-priority-class",
        ),
        pytest.param(
            {"memory": "lots"},
            "`memory` is 'lots', which is not a quantity such as '2', '500m', '4Gi' or '16G'; "
            "write a quantity such as 2, '500m' or '8Gi'",
            id="memory-not-a-quantity",
        ),
        pytest.param(
            {"checkpoint": {"grace": 10}},
            "`checkpoint` has an unknown key `grace` (did you mean `grace_seconds`?); its keys "
            "are enabled, path, claim, grace_seconds, keep, continuous",
            id="checkpoint-unknown-key",
        ),
        pytest.param(
            {"gpu": 1},
            "unknown config key `gpu` (did you mean `gpus`?); the keys are admission_timeout, "
            "backend,",
            id="unknown-key-did-you-mean",
        ),
        pytest.param(
            {"gpus": 1, "queue_name": "gpu", "colour": "red"},
            "unknown config keys `colour`, `queue_name` (did you mean `queue` for `queue_name`?)",
            id="two-unknown-keys",
        ),
        pytest.param(
            {"gpus": True},
            "kernelspec config key 'gpus' must be a whole number such as 1, not true (a boolean)",
            id="gpus-true",
        ),
        pytest.param(
            {"pod_group_size": False},
            "kernelspec config key 'pod_group_size' must be a whole number such as 1, not false",
            id="pod-group-size-false",
        ),
        pytest.param(
            {"admission_timeout": True},
            "kernelspec config key 'admission_timeout' must be a number of seconds such as 60, "
            "not true (a boolean)",
            id="admission-timeout-true",
        ),
        pytest.param(
            {"cpu": float("inf")},
            "`cpu` is Infinity, which is not a finite number; write a quantity such as 2, "
            "'500m' or '8Gi'",
            id="cpu-infinity",
        ),
        pytest.param(
            {"memory": float("nan")},
            "`memory` is NaN, which is not a finite number",
            id="memory-nan",
        ),
        pytest.param(
            {"cpu": True},
            "kernelspec config key 'cpu' must be a quantity such as 2, '500m' or '8Gi', not true "
            "(a boolean)",
            id="cpu-true",
        ),
        pytest.param(
            {"startup_timeout": float("nan")},
            "`startup_timeout` is NaN; give the finite, positive number of seconds a kernel may "
            "take to start",
            id="startup-timeout-nan",
        ),
        pytest.param(
            {"admission_timeout": float("inf")},
            "`admission_timeout` is Infinity; give a finite number of seconds, or 0 to wait "
            "forever",
            id="admission-timeout-infinity",
        ),
        pytest.param(
            {"checkpoint": {"grace_seconds": float("inf")}},
            "`checkpoint.grace_seconds` is Infinity; give a finite number of seconds",
            id="grace-infinity",
        ),
        pytest.param(
            {"checkpoint": {"grace_seconds": True}},
            "`checkpoint.grace_seconds` is true; give a positive number of seconds",
            id="grace-true",
        ),
        pytest.param(
            {"checkpoint": {"enabled": True, "path": "checkpoints/here"}},
            "`checkpoint.path` is 'checkpoints/here', a relative path; give an absolute directory",
            id="relative-checkpoint-path",
        ),
        pytest.param(
            {"checkpoint": {"enabled": True, "claim": "kernel-checkpoints"}},
            "`checkpoint.claim` names a PersistentVolumeClaim, which only the kubernetes backend "
            "mounts; on the local backend use `checkpoint.path`",
            id="claim-on-local",
        ),
        pytest.param(
            {"checkpoint": {"enabled": True, "grace_seconds": 3}},
            "`checkpoint.grace_seconds` is 3, which leaves no time to save: the save must end "
            "3 s before the kernel is stopped; use 4 or more seconds",
            id="grace-below-the-save-margin",
        ),
        pytest.param(
            {"park_after": -5},
            "`park_after` is -5.0; give the seconds a kernel may sit idle before it is parked, or "
            "0 never to park",
            id="park-after-negative",
        ),
        pytest.param(
            {"park_after": 1800},
            "`park_after` is 1800 but checkpoints are off, so a parked kernel would lose its "
            "variables; turn them on with `checkpoint.enabled`, or set park_after to 0",
            id="park-after-without-checkpoints",
        ),
        pytest.param(
            {"checkpoint": {"enabled": True, "continuous": "yes"}},
            "`checkpoint.continuous` is 'yes'; write true or false",
            id="continuous-not-a-boolean",
        ),
        pytest.param(
            {"queue": "gpu\ud800"},
            "`queue` is 'gpu\\ud800', which is not valid text (a lone surrogate)",
            id="lone-surrogate",
        ),
        pytest.param(
            {"checkpoint": {"enabled": True, "path": "/proc/kernel-queue"}},
            "`checkpoint.path` is '/proc/kernel-queue', but /proc lies in /proc, which the "
            "operating system makes up: no files go there; give a directory this server can "
            "create and write in",
            id="proc-checkpoint-path",
        ),
        pytest.param(
            {"image": "quay.io/jupyter/minimal-notebook"},
            "`image` is read by the kubernetes backend only, and this kernelspec runs on the "
            "local backend; remove it, or set `backend` to 'kubernetes'",
            id="kube-only-image",
        ),
        pytest.param(
            {"namespace": "team-a"},
            "`namespace` is read by the kubernetes backend only",
            id="kube-only-namespace",
        ),
        pytest.param(
            {"worker_command": ["dask", "worker"]},
            "`worker_command` is read by the kubernetes backend only",
            id="kube-only-worker-command",
        ),
    ],
)
async def test_bad_config_fails_the_kernel_with_a_clear_error(
    server: Server, kernelspec: KernelspecFactory, config: dict[str, Any], expected: str
) -> None:
    model = await _failure(server, kernelspec(**config))
    assert expected in model["reason"]


async def test_an_unwritable_checkpoint_path_is_refused_at_launch(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    where = blocker / "checkpoints"
    model = await _failure(server, kernelspec(checkpoint={"enabled": True, "path": str(where)}))
    assert f"`checkpoint.path` is '{where}', but {blocker} is not a directory" in model["reason"]
    assert not where.exists()


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """`directory` made unwritable for this process: mode 0500, and for root, who writes
    through any mode, the immutable attribute (`chattr +i`), taken off again after."""
    directory.mkdir(mode=0o500)
    if os.geteuid() != 0:
        yield
        return
    chattr = shutil.which("chattr")
    assert chattr, "as root, this test needs chattr (Debian's e2fsprogs) to lock a directory"
    subprocess.run([chattr, "+i", str(directory)], check=True)
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(directory)], check=True)


async def test_a_read_only_checkpoint_directory_is_refused_at_launch(
    server: Server, kernelspec: KernelspecFactory, tmp_path: Path
) -> None:
    locked = tmp_path / "locked"
    where = locked / "checkpoints"
    with read_only(locked):
        spec = kernelspec(checkpoint={"enabled": True, "path": str(where)})
        model = await _failure(server, spec)
        assert (
            f"`checkpoint.path` is '{where}', but this server cannot write in {locked}"
            in (model["reason"])
        )
        assert not where.exists()


async def test_admission_timeout_ends_the_wait_and_frees_the_place(
    server: Server, kernelspec: KernelspecFactory
) -> None:
    busy = kernelspec("busy", gpus=2)
    patient = kernelspec("impatient", gpus=1, admission_timeout=1)
    holder = await server.start_running(busy)
    launchers = launcher_pids()

    waiter = await server.start(patient)

    async def dead() -> bool:
        return (await server.model(waiter))["execution_state"] == "dead"

    await server.wait_for(dead)
    reason = (await server.model(waiter))["reason"]
    assert "without being admitted (admission_timeout)" in reason
    assert "raise `admission_timeout` in the kernelspec" in reason
    assert launcher_pids() == launchers
    backend = server.backend()
    assert [g.spec.kernelspec for g in backend._groups.values()] == ["busy"]
    await server.shutdown_and_wait(holder)


class TestAnUnwritableCheckpointRoot:
    """`c.LocalBackend.checkpoint_root` (where checkpoints go without `checkpoint.path`) is
    checked at launch too, and the sentence names the server setting, not a kernelspec key."""

    @pytest.fixture
    def local_backend_config(self, tmp_path: Path) -> dict[str, Any]:
        blocker = tmp_path / "a-file"
        blocker.write_text("not a directory")
        return {"gpus": ["0"], "checkpoint_root": str(blocker / "checkpoints")}

    async def test_is_refused_at_launch_naming_the_setting(
        self, server: Server, kernelspec: KernelspecFactory, tmp_path: Path
    ) -> None:
        model = await _failure(server, kernelspec(checkpoint={"enabled": True}))
        blocker = tmp_path / "a-file"
        assert (
            f"c.LocalBackend.checkpoint_root is '{blocker / 'checkpoints'}', but {blocker} is "
            "not a directory" in model["reason"]
        ), model["reason"]
