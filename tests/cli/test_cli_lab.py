"""`jupyter kernel-queue lab --help` and `./scripts/lab` as a user runs them: the help documents
every flag the banner mentions, a bad --pretend-gpus is a sentence, and the first run of
./scripts/lab says what it installs and how long it takes, lets pip show its progress and puts
notebooks in a git-ignored folder. (JupyterLab itself starts in test_cli.py's lab test.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_queue.backends.local import gpus as gpu_detection
from kernel_queue.cli.lab import inventory_message
from tests.commands import ran

REPO = Path(__file__).resolve().parents[2]
JUPYTER = str(Path(sys.executable).parent / "jupyter")


def lab(*args: str) -> subprocess.CompletedProcess[str]:
    return ran([JUPYTER, "kernel-queue", "lab", *args], env=os.environ)


def test_lab_help_documents_every_flag_the_banner_mentions() -> None:
    done = lab("--help")
    assert done.returncode == 0, done.stderr
    banners = [
        inventory_message([], None, 2),
        inventory_message([gpu_detection.Gpu("0", "NVIDIA H200")], None, 2),
        inventory_message([], "0", 2),
    ]
    flags = {flag for banner in banners for flag in re.findall(r"--[a-z][a-z-]*", banner)}
    assert "--pretend-gpus" in flags
    for flag in flags:
        assert re.search(rf"^\s+{flag}\b", done.stdout, re.MULTILINE), (flag, done.stdout)
    assert "fails at once" in " ".join(done.stdout.split())  # as the banner says


def test_lab_refuses_a_pretend_gpus_that_is_not_a_number() -> None:
    done = lab("--pretend-gpus", "two")
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        "jupyter kernel-queue lab: --pretend-gpus must be a whole number of GPUs (0 or more), "
        "not 'two'\n",
    )


FAKE_PYTHON = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/../python.log"
"""
FAKE_JUPYTER = """#!/bin/sh
echo "$@" > "$(dirname "$0")/../jupyter.log"
"""


@pytest.fixture
def fake_venv() -> Iterator[str]:
    """A virtual environment (relative to the checkout, as VENV is) whose python and jupyter
    only write down how they were called: what scripts/lab runs, without installing."""
    relative = f"test-artifacts/cli-lab-{os.getpid()}/venv"
    venv = REPO / relative
    (venv / "bin").mkdir(parents=True)
    for name, text in (("python", FAKE_PYTHON), ("jupyter", FAKE_JUPYTER)):
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    yield relative
    shutil.rmtree(venv.parent)


def scripts_lab(venv: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VENV": venv, "PYTHON": sys.executable}
    return ran([str(REPO / "scripts" / "lab"), *args], env=env)


def test_scripts_lab_says_what_it_installs_shows_pip_and_keeps_notebooks_ignored(
    fake_venv: str,
) -> None:
    venv = REPO / fake_venv
    first = scripts_lab(fake_venv, "--no-browser")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(
        "First run: installing JupyterLab 4, Jupyter Server, ipykernel, NumPy and dill\n"
    )
    assert "about 1 to 2\nminutes on a fast connection (pip shows its progress below)" in (
        first.stdout
    )
    pip = (venv / "python.log").read_text()
    assert "-m pip install --progress-bar on --editable .[lab]" in pip
    assert "--quiet" not in pip
    notebooks = REPO / "notebooks"
    assert f"kernel-queue: notebooks go to {notebooks} (git-ignored)\n" in first.stdout
    assert (venv / "jupyter.log").read_text() == (
        f"kernel-queue lab --ServerApp.root_dir={notebooks} --no-browser\n"
    )
    assert notebooks.is_dir()
    ignored = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", "-q", "notebooks/Untitled.ipynb"], check=False
    )
    assert ignored.returncode == 0, "notebooks/ is not git-ignored"

    (venv / "python.log").unlink()
    again = scripts_lab(fake_venv, "--notebook-dir=/srv/work")
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""  # installed: nothing to say, no pip
    assert not (venv / "python.log").exists()
    assert (venv / "jupyter.log").read_text() == "kernel-queue lab --notebook-dir=/srv/work\n"
