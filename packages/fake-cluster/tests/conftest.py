"""The fake cluster's own tests: pytest-jupyter's event loop runs the async tests, the
package's plugin gives the `fake_cluster` fixture, and Kueue's CRDs are the checkout's
(`../shared/data/kueue/crds`) unless $KERNEL_QUEUE_FAKE_CLUSTER_CRDS names others."""

from __future__ import annotations

import os

from kernel_queue_fake_cluster.apiserver import crds as crd_files
from prerequisites import KUEUE_CRDS

os.environ.setdefault(crd_files.ENVIRONMENT_VARIABLE, str(KUEUE_CRDS))

pytest_plugins = ["pytest_jupyter.jupyter_core", "kernel_queue_fake_cluster.plugin"]
