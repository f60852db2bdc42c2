"""Small pure pieces: GPU listing parse, quantities, the public surface, kernelspec validation."""

from __future__ import annotations

import pytest

import kernel_queue
from kernel_queue import quantities
from kernel_queue.backends.gpus import Gpu, parse_nvidia_smi
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
    [("2", 2000), ("500m", 500), ("1.5", 1500), (3, 3000), ("0.1", 100), ("1001m", 1001)],
)
def test_cpu_quantities_become_millicores(text: str | int, millis: int) -> None:
    assert quantities.millicores(text) == millis


@pytest.mark.parametrize(
    ("text", "amount"),
    [("8Gi", 8 * 2**30), ("16G", 16 * 10**9), ("512Mi", 512 * 2**20), ("1000", 1000)],
)
def test_memory_quantities_become_bytes(text: str, amount: int) -> None:
    assert quantities.bytes_(text) == amount


@pytest.mark.parametrize("text", ["lots", "8 GB", "-1", "Gi", ""])
def test_bad_quantities_are_refused_naming_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        quantities.parse(text)


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
