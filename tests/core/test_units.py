"""Small pure pieces: GPU listing parse, quantities, the public surface, kernelspec validation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import kernel_queue
from kernel_queue import quantities, spec
from kernel_queue.backends.local import settings
from kernel_queue.backends.local.gpus import Gpu, parse_nvidia_smi
from kernel_queue.cli.install import InstallError, kernel_json
from kernel_queue.cli.status import render, rows

SMI = """\
GPU 0: NVIDIA H200 (UUID: GPU-5c1b0a3e-4a1f-2b7c-9d3e-1f2a3b4c5d6e)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-0d9e8f7a-6b5c-4d3e-2f1a-0b9c8d7e6f5a)
  MIG 3g.40gb     Device  0: (UUID: MIG-11111111-2222-3333-4444-555555555555)
GPU 2: Tesla T4
"""


def test_nvidia_smi_listing_gives_indices_names_and_uuids_and_skips_mig_lines() -> None:
    assert parse_nvidia_smi(SMI) == [
        Gpu("0", "NVIDIA H200", "GPU-5c1b0a3e-4a1f-2b7c-9d3e-1f2a3b4c5d6e"),
        Gpu("1", "NVIDIA A100-SXM4-80GB", "GPU-0d9e8f7a-6b5c-4d3e-2f1a-0b9c8d7e6f5a"),
        Gpu("2", "Tesla T4", ""),
    ]


def test_an_empty_or_failed_listing_has_no_gpus() -> None:
    assert parse_nvidia_smi("") == []
    assert parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate") == []


@pytest.mark.parametrize(
    ("text", "millis"),
    [
        ("2", 2000),
        ("500m", 500),
        ("1.5", 1500),
        (3, 3000),
        ("0.1", 100),
        ("1001m", 1001),
        pytest.param("1e3", 1_000_000, id="exponent"),
        pytest.param("1E3", 1_000_000, id="capital-exponent"),
        pytest.param("1e-3", 1, id="negative-exponent"),
        pytest.param("2k", 2_000_000, id="kilo"),
        pytest.param("+2", 2000, id="plus-sign"),
        pytest.param("5.", 5000, id="trailing-dot"),
        pytest.param(".5", 500, id="leading-dot"),
        pytest.param("100u", 1, id="micro-rounds-up"),
        pytest.param("250000n", 1, id="nano-rounds-up"),
        pytest.param(1e3, 1_000_000, id="json-float"),
    ],
)
def test_cpu_quantities_become_millicores(text: str | int | float, millis: int) -> None:
    assert quantities.millicores(text) == millis


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("8Gi", 8 * 2**30),
        ("16G", 16 * 10**9),
        ("512Mi", 512 * 2**20),
        ("1000", 1000),
        pytest.param("1.5Gi", 3 * 2**29, id="fractional-binary"),
        pytest.param("1e3", 1000, id="exponent"),
        pytest.param("129e6", 129 * 10**6, id="exponent-six"),
        pytest.param("1E", 10**18, id="exa-not-exponent"),
        pytest.param("2k", 2000, id="kilo"),
        pytest.param("1Ki", 1024, id="kibi"),
    ],
)
def test_memory_quantities_become_bytes(text: str, amount: int) -> None:
    assert quantities.bytes_(text) == amount


@pytest.mark.parametrize(
    "text",
    [
        "lots",
        "8 GB",
        "Gi",
        "",
        pytest.param(" 1", id="leading-space"),
        pytest.param("1 ", id="trailing-space"),
        pytest.param("1K", id="capital-kilo"),
        pytest.param("1ki", id="lower-kibi"),
        pytest.param("1Gib", id="gib"),
        pytest.param("1e", id="exponent-without-digits"),
        pytest.param("1e3.5", id="fractional-exponent"),
        pytest.param("1.2.3", id="two-dots"),
        pytest.param(".", id="dot"),
        pytest.param("e3", id="no-number"),
        pytest.param("1m5", id="digits-after-suffix"),
    ],
)
def test_bad_quantities_are_refused_naming_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity") as caught:
        quantities.parse(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("-1", "'-1' is negative", id="negative"),
        pytest.param(-0.5, "-0.5 is negative", id="negative-number"),
        pytest.param(True, "True is not a quantity", id="boolean"),
        pytest.param(float("nan"), "nan is not a finite number", id="nan"),
        pytest.param(float("inf"), "inf is not a finite number", id="infinity"),
        pytest.param("1e30", "'1e30' is larger than Kubernetes allows", id="too-large"),
        pytest.param("1e999999999", "is larger than Kubernetes allows", id="huge-exponent"),
    ],
)
def test_quantities_kubernetes_cannot_hold_are_refused(value: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        quantities.parse(value)  # type: ignore[arg-type]
    assert message in str(caught.value)


def test_a_checkpoint_directory_is_checked_without_creating_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert settings.directory_problem(tmp_path / "new" / "deeper") is None
    (tmp_path / "file").write_text("")
    assert (
        settings.directory_problem(tmp_path / "file" / "x")
        == f"{tmp_path / 'file'} is not a directory"
    )
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a non-root user sees it
    assert settings.directory_problem(tmp_path / "new") == f"this server cannot write in {tmp_path}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize(
    ("config", "backend", "problem"),
    [
        pytest.param(
            {"enabled": True, "claim": "ckpt", "grace_seconds": 8.9},
            "kubernetes",
            spec.Problem(
                "checkpoint.grace_seconds",
                "is 8.9, which leaves no time to save: the launcher stops the kernel 5 s before "
                "the pod's grace period ends, and the save must end 3 s before that",
                "use 9 or more seconds",
            ),
            id="kubernetes-grace",
        ),
        pytest.param(
            {"enabled": True, "claim": "ckpt", "path": "/srv/ckpt"},
            "kubernetes",
            spec.Problem(
                "checkpoint.path",
                "is a directory of this machine, which a pod cannot reach",
                "on the kubernetes backend name a PersistentVolumeClaim with `checkpoint.claim`",
            ),
            id="path-on-kubernetes",
        ),
        pytest.param(
            {"claim": "My Claim"},
            "kubernetes",
            spec.Problem(
                "checkpoint.claim",
                "is 'My Claim', which Kubernetes does not accept as a PersistentVolumeClaim name",
                "use lower-case letters, digits, '-' and '.', at most 253 characters, each "
                "dot-separated part starting and ending with a letter or digit",
            ),
            id="bad-claim-name",
        ),
        pytest.param(
            {"keep": True},
            "local",
            spec.Problem(
                "checkpoint.keep",
                "is true but checkpoints are off",
                "turn them on with `checkpoint.enabled`, or leave `checkpoint.keep` out",
            ),
            id="keep-without-checkpoints",
        ),
    ],
)
def test_checkpoint_rules(config: dict[str, object], backend: str, problem: spec.Problem) -> None:
    with pytest.raises(spec.Problem) as caught:
        spec.checkpoint_settings(config, backend)
    assert caught.value == problem


@pytest.mark.parametrize(("backend", "least"), [("local", 4), ("kubernetes", 9)])
def test_the_least_grace_leaves_a_second_to_save(backend: str, least: int) -> None:
    assert spec.min_grace_seconds(backend) == least
    config = {"enabled": True, "grace_seconds": least, "claim": "c" if backend != "local" else None}
    settings, grace = spec.checkpoint_settings(config, backend)
    assert (settings.enabled, grace) == (True, least)


def test_public_surface_is_sorted_complete_and_importable() -> None:
    assert kernel_queue.__all__ == sorted(kernel_queue.__all__)
    for name in kernel_queue.__all__:
        assert getattr(kernel_queue, name) is not None
    assert kernel_queue.QueuedKernelProvisioner.__name__ == "QueuedKernelProvisioner"
    assert issubclass(kernel_queue.AdmissionTimeout, TimeoutError)
    assert issubclass(kernel_queue.QueueNotFound, kernel_queue.KernelQueueError)


def test_install_builds_a_kernelspec_with_only_the_keys_given() -> None:
    spec = kernel_json(display_name="GPU x2", backend="local", queue="gpu", gpus=2, cpu="4")
    assert spec == {
        "argv": ["python", "-m", "kernel_queue.launcher.kernel", "-f", "{connection_file}"],
        "display_name": "GPU x2",
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {
            "debugger": True,
            "kernel_provisioner": {
                "provisioner_name": "kernel-queue",
                "config": {"backend": "local", "queue": "gpu", "gpus": 2, "cpu": "4"},
            },
        },
    }


def test_install_refuses_a_negative_admission_timeout() -> None:
    with pytest.raises(InstallError, match="--admission-timeout must be 0"):
        kernel_json(display_name="x", backend="local", queue="q", gpus=0, admission_timeout=-1)


def test_status_table_shows_position_and_message() -> None:
    listing = [
        {
            "id": "0123456789abcdef",
            "name": "python3-gpu-queued",
            "execution_state": "starting",
            "queue": {
                "state": "queued",
                "queue": "gpu",
                "position": 2,
                "queue_length": 3,
                "gpus": 1,
                "message": "queued in 'gpu', position 2 of 3, needs 1 GPU",
            },
        },
        {"id": "fedcba9876543210", "name": "python3", "execution_state": "idle", "queue": None},
    ]
    assert render(rows(listing)).splitlines() == [
        "KERNEL    KERNELSPEC          STATE   QUEUE  POSITION  GPUS  MESSAGE",
        "01234567  python3-gpu-queued  queued  gpu    2 of 3    1     "
        "queued in 'gpu', position 2 of 3, needs 1 GPU",
        "fedcba98  python3             idle",
    ]
