"""Where the fake cluster's tests find Kueue's own files, and how a missing one is reported.

Kueue's CRDs come from $KERNEL_QUEUE_FAKE_CLUSTER_CRDS, which conftest.py sets to the checkout's
`../shared/data/kueue/crds` (beside the repository) when it is unset; Kueue's example manifests
are read from `../shared/data/kueue/examples`, Kueue 0.14's CRDs and examples from
`../shared/data/kueue/v0.14`. Nothing of Kueue is copied into the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernel_queue_fake_cluster.apiserver import crds as crd_files

KUEUE_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "kueue"
"""Kueue's CRDs (`crds/`) and example manifests (`examples/`) next to the checkout, 0.14's in
`v0.14/`."""
KUEUE_CRDS = Path(os.environ.get(crd_files.ENVIRONMENT_VARIABLE) or KUEUE_DATA / "crds")
"""The CRDs the fake reads in these tests: the variable's path, else the checkout's."""


def skip_unless_ci(message: str) -> None:
    """Skip with `message`, or fail with it in CI (`KQ_CI=1`, set by .ci/run, or `CI=true`)
    where a missing prerequisite must not hide a suite; it never returns."""
    if os.environ.get("KQ_CI") == "1" or os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)
