"""The CLI tests' fixtures: a user's environment with Jupyter's user dirs private to the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_support import private_env


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Jupyter user dirs are private to the test."""
    return private_env(tmp_path)
