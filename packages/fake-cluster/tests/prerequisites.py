"""Where the fake cluster's tests find Kueue's own files, and how a missing one is reported.

Kueue's CRDs and example manifests are read from the checkout's `../shared/data/kueue` (beside
the repository); nothing of Kueue is copied into the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

KUEUE_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "kueue"
"""Kueue's CRDs (`crds/`) and example manifests (`examples/`) next to the checkout."""


def skip_unless_ci(message: str) -> None:
    """Skip with `message`, or fail with it in CI (`KQ_CI=1`, set by .ci/run, or `CI=true`)
    where a missing prerequisite must not hide a suite; it never returns."""
    if os.environ.get("KQ_CI") == "1" or os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)
