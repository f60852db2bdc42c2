"""Running the launcher from the archive the server delivers: ``python /…/launcher.pyz``.

The kubernetes backend mounts the archive (``kernel_queue.kube.objects.launcher_archive`` builds it)
into each kernel pod, so an image needs only Python and ipykernel. ``main`` is the archive's entry
point: it checks the image before anything else (a missing ipykernel is said in one line, on stderr
and in the container's termination message, status ``IMAGE_EXIT_CODE``), puts the pure- Python
libraries bundled in the archive (``FALLBACK``, dill) *after* the image's own, and runs the
launcher, or with ``kernel`` as its first argument the kernel. Stdlib only; it must also run, far
enough to say so, on a Python too old for the rest.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence

from kernel_queue import launcher
from kernel_queue.launcher import contract
from kernel_queue.launcher.origin import KERNEL_COMMAND, path

FALLBACK = launcher.ARCHIVE_FALLBACK
IMAGE_EXIT_CODE = launcher.IMAGE_EXIT_CODE
MIN_PYTHON = (3, 10)


def missing() -> str | None:
    """What this image lacks to run a kernel, in one line; None when nothing is missing."""
    version = sys.version.split()[0]
    where = f"{sys.executable} (Python {version})"
    if sys.version_info[:2] < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return f"{sys.executable} is Python {version}, too old: the launcher needs {need} or newer"
    if importlib.util.find_spec("ipykernel") is None:
        return f"no module named ipykernel in {where}"
    return None


def say(line: str, environ: Mapping[str, str] = os.environ) -> None:
    """Write ``line`` to stderr and to the container's termination message file (the launch's
    ``KERNEL_QUEUE_LAUNCH_TERMINATION_LOG``, else Kubernetes' default), if there is one."""
    print(f"[kernel-queue launcher] {line}", file=sys.stderr, flush=True)
    target = environ.get(contract.ENV_TERMINATION_LOG) or contract.DEFAULT_TERMINATION_LOG
    if not os.path.isfile(target):
        return  # not in a pod (the kubelet makes the file): stderr is all there is
    try:
        with open(target, "w", encoding="utf-8") as file:
            file.write(line[:4000])
    except OSError:
        pass  # a read-only message file: stderr has said it


def main(argv: Sequence[str] | None = None) -> int:
    """Check the image, then run the launcher or (``kernel …``) the kernel; return its status."""
    args = list(sys.argv[1:] if argv is None else argv)
    archive = path()
    if archive is not None:
        sys.path.append(os.path.join(archive, FALLBACK))  # after the image's site-packages
    if args[:1] == [KERNEL_COMMAND]:
        from kernel_queue.launcher import kernel

        sys.argv = [sys.argv[0], *args[1:]]
        return kernel.main()
    worker = "--worker" in args or os.environ.get(contract.ENV_MODE, "").strip() == "worker"
    if not worker:
        problem = missing()
        if problem is not None:
            say(problem)
            return IMAGE_EXIT_CODE
    from kernel_queue.launcher import __main__ as launcher_main

    return launcher_main.main(args)
