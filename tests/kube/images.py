"""Kernel images for the fake kubelet that really lack kernel-queue: `image_paths` targets.

`bare_kernel_bin` is the bin dir of `.venv-bare` (scripts/bare-kernel-env: ipykernel only, no
kernel-queue, dill, numpy or blake3), built once and kept until the script changes (about 20 s
from pip's cache). `no_ipykernel_bin` is a virtual environment without pip or anything else,
and `no_python_bin` an empty directory: images mapped there have no `python` at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ipykernel

from tests.kube.support import REPO

BARE_ENV_SCRIPT = REPO / "scripts" / "bare-kernel-env"
EXAMPLE_IMAGE = "quay.io/jupyter/scipy-notebook:*"
"""kernelspecs/kubernetes-gpu-example's image (pattern): mapped to the ipykernel-only venv."""
NO_IPYKERNEL_IMAGE = "registry.example/python-only:3.11"
NO_PYTHON_IMAGE = "registry.example/busybox:1.36"
MISSING_IMAGE = "registry.example/missing:*"
"""Images no registry has: their pull fails (ErrImagePull, then ImagePullBackOff) on every
plane's node."""


def paths(root: Path) -> dict[str, str]:
    """Image pattern -> bin dir: the example's image, one without ipykernel, one without python
    (under `root`); where `make(root)` puts them, made or not (a node maps them from its start,
    a test that runs them makes them first)."""
    bare = Path(os.environ.get("BARE_VENV", ".venv-bare"))
    return {
        EXAMPLE_IMAGE: str((REPO / bare / "bin").absolute()),
        NO_IPYKERNEL_IMAGE: str(root / "python-only" / "bin"),
        NO_PYTHON_IMAGE: str(root / "no-python" / "bin"),
    }


def make(root: Path) -> dict[str, str]:
    """Make the images of `paths(root)` (the bare kernel's environment built when missing or
    stale); return `paths(root)`."""
    found = {
        EXAMPLE_IMAGE: str(bare_kernel_bin()),
        NO_IPYKERNEL_IMAGE: str(no_ipykernel_bin(root)),
        NO_PYTHON_IMAGE: str(no_python_bin(root)),
    }
    assert found == paths(root), (found, paths(root))
    return found


def bare_kernel_bin() -> Path:
    """The bin dir of `.venv-bare` (built by scripts/bare-kernel-env when missing or stale)."""
    env = {**os.environ, "IPYKERNEL": ipykernel.__version__}  # this environment's version
    done = subprocess.run(
        [str(BARE_ENV_SCRIPT)], capture_output=True, text=True, timeout=600, check=False, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the bare kernel environment failed:\n{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


def no_ipykernel_bin(root: Path) -> Path:
    """A virtual environment under `root` with Python only (no pip, no ipykernel)."""
    venv = root / "python-only"
    if not (venv / "bin" / "python").exists():
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
        )
    return venv / "bin"


def no_python_bin(root: Path) -> Path:
    """An empty bin dir: an image without any Python."""
    empty = root / "no-python" / "bin"
    empty.mkdir(parents=True, exist_ok=True)
    return empty
