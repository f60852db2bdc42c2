"""The JupyterLab extension as installed: JupyterLab lists it enabled, and its state logic passes
its unit tests in the JavaScript toolchain (vitest, `npm test`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_queue import __version__

REPO = Path(__file__).resolve().parents[2]
JUPYTER = str(Path(sys.executable).parent / "jupyter")


def test_jupyterlab_lists_the_extension_enabled(tmp_path: Path) -> None:
    if not (REPO / "kernel_queue" / "labextension" / "package.json").exists():
        # An editable install without npm skips the build (optional-editable-build).
        if os.environ.get("KQ_CI") == "1" or shutil.which("npm"):
            pytest.fail("the JupyterLab extension was not built; reinstall kernel-queue")
        pytest.skip("the JupyterLab extension is not built (needs npm)")
    # Private user dirs: only what the environment's installation provides counts.
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update(HOME=str(tmp_path), JUPYTER_CONFIG_DIR=str(tmp_path), JUPYTER_DATA_DIR=str(tmp_path))
    done = subprocess.run(
        [JUPYTER, "labextension", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    listing = uncoloured(done.stdout + done.stderr)
    assert re.search(rf"kernel-queue v{re.escape(__version__)} enabled\s+OK", listing), listing


def test_the_extension_state_logic_passes_its_unit_tests() -> None:
    npm = shutil.which("npm")
    if npm is None:
        if os.environ.get("KQ_CI") == "1":
            pytest.fail("npm is needed to run the extension's unit tests")
        pytest.skip("npm is not installed")
    if not (REPO / "node_modules" / ".bin" / "vitest").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=REPO, check=True, timeout=600)
    done = subprocess.run(
        [npm, "test"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    output = uncoloured(done.stdout + done.stderr)  # vitest colours its report when CI is set
    assert done.returncode == 0, output
    assert re.search(r"Tests\s+\d+ passed", output), output


def uncoloured(text: str) -> str:
    """`text` without terminal colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
