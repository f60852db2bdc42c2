"""Find the machine's NVIDIA GPUs for the local backend: NVML first, then `nvidia-smi -L`.

Blocking calls (a shared library, a subprocess): callers run `detect()` off the event loop.
Returns device indices as strings, the form `CUDA_VISIBLE_DEVICES` takes.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from dataclasses import dataclass

_SMI_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?\s*$")


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver lists it."""

    index: str
    name: str
    uuid: str = ""


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse `nvidia-smi -L` output ("GPU 0: NVIDIA H200 (UUID: GPU-…)"), skipping MIG lines."""
    gpus = []
    for line in text.splitlines():
        match = _SMI_LINE.match(line.strip())
        if match:
            gpus.append(Gpu(match.group(1), match.group(2), match.group(3) or ""))
    return gpus


def _from_nvml() -> list[Gpu] | None:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                continue
            name = ctypes.create_string_buffer(96)
            uuid = ctypes.create_string_buffer(96)
            nvml.nvmlDeviceGetName(handle, name, 96)
            nvml.nvmlDeviceGetUUID(handle, uuid, 96)
            gpus.append(Gpu(str(index), name.value.decode(), uuid.value.decode()))
        return gpus
    finally:
        nvml.nvmlShutdown()


def _from_nvidia_smi() -> list[Gpu]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else []


def detect() -> list[Gpu]:
    """The GPUs the NVIDIA driver reports; empty on a machine without one. Blocking."""
    found = _from_nvml()
    return found if found is not None else _from_nvidia_smi()
