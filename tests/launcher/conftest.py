"""The launcher tests' fixtures: `launch` (tests/launcher/processes.py) and `start_kernel`
(tests/launcher/kernels.py)."""

from tests.launcher.kernels import start_kernel
from tests.launcher.processes import launch

__all__ = ["launch", "start_kernel"]
