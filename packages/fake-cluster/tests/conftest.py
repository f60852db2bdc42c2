"""The fake cluster's own tests: pytest-jupyter's event loop runs the async tests, and the
package's plugin gives the `fake_cluster` fixture."""

from __future__ import annotations

pytest_plugins = ["pytest_jupyter.jupyter_core", "kernel_queue_fake_cluster.plugin"]
