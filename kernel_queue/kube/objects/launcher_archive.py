"""The launcher archive the server delivers to kernel pods, and the ConfigMap that carries it.

`build` zips the installed ``kernel_queue.launcher`` and ``kernel_queue.checkpoint`` with the
two modules they import, ``_version`` and ``errors`` (under a package ``__init__`` of its own),
and, in ``launcher.ARCHIVE_FALLBACK``, the pure-Python dill of the server's environment, into a
zipapp whose ``__main__`` is ``launcher.archive.main``: ``python launcher.pyz`` in any image
with Python and ipykernel runs the server's own launcher. Beside each ``.py`` lies its bytecode
for the server's Python (``.pyc``, hash-based and unchecked: the archive never changes), which
``zipimport`` prefers, so a pod's launcher and kernel do not compile every module at each start
(about 20 ms a process); an image whose Python differs reads the bytecode's magic number and
compiles the source as before. The bytes are the same for the same sources and Python (fixed
timestamps and order), so its ConfigMap is content-addressed (`Archive.name`):
one per namespace and archive, shared by every kernel there. Blocking file reads: the backend
builds it in a thread, once per process (`current`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import io
import marshal
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_queue import _version, errors, launcher
from kernel_queue.kube import kueue

FILE = "launcher.pyz"
"""The archive's key in the ConfigMap and its file name in the pod."""
MOUNT = "/var/lib/kernel-queue/launcher"
"""Where the ConfigMap is mounted (read-only) in a kernel's containers."""
PATH = f"{MOUNT}/{FILE}"
VOLUME = "kernel-queue-launcher"
COMMAND = ("python", PATH)
"""The command that runs the delivered launcher, in place of ``python -m kernel_queue.launcher``."""
LIMIT = 1 << 20
"""The API server refuses a ConfigMap whose data exceed 1 MiB (``MaxSecretSize``)."""
PACKAGES = ("kernel_queue.launcher", "kernel_queue.checkpoint")
MODULES = ("kernel_queue._version", "kernel_queue.errors")
PACKAGE = (
    '"""kernel-queue\'s launcher and checkpoint library, as a server delivered them."""\n\n'
    "from kernel_queue._version import __version__ as __version__\n"
)
"""The archive's ``kernel_queue/__init__.py``: the installed one also reaches server code."""
BUNDLED = ("dill",)
"""Pure-Python libraries copied from the server's environment into the archive's fallback
folder: the image's own copy wins where it has one (it comes first on ``sys.path``)."""
MAIN = "from kernel_queue.launcher import archive\nraise SystemExit(archive.main())\n"
_STAMP = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: the same bytes at every build


@dataclass(frozen=True)
class Archive:
    """One built archive: its bytes, what it bundles and what is left to the image."""

    data: bytes = b""
    bundled: tuple[str, ...] = ()
    """Libraries in the fallback folder (with their versions), e.g. ``dill 0.4.1``."""

    @property
    def digest(self) -> str:
        """The sha256 of the bytes, hex."""
        return hashlib.sha256(self.data).hexdigest()

    @property
    def name(self) -> str:
        """The ConfigMap's name: ``kq-launcher-<version>-<sha12>``, a valid object name."""
        version = re.sub(r"[^a-z0-9.-]+", "-", _version.__version__.lower()).strip(".-")
        return f"kq-launcher-{version}-{self.digest[:12]}"


def build(libraries: Sequence[str] = BUNDLED) -> Archive:
    """Zip the launcher, the checkpoint library and `libraries` (as found here; blocking)."""
    buffer = io.BytesIO()
    bundled = []
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        _add(out, "__main__.py", MAIN.encode())
        _add(out, "kernel_queue/__init__.py", PACKAGE.encode())
        for module in MODULES:
            origin = _origin(module)
            _add(out, _relative(module, origin), origin.read_bytes())
        for package in PACKAGES:
            _add_package(out, _origin(package).parent, package.replace(".", "/"))
        for library in libraries:
            spec = importlib.util.find_spec(library)
            if spec is None or spec.origin is None:
                continue  # not installed beside the server: the image must bring it
            folder = Path(spec.origin).parent
            _add_package(out, folder, f"{launcher.ARCHIVE_FALLBACK}/{library}")
            bundled.append(f"{library} {_library_version(library)}")
    found = Archive(buffer.getvalue(), tuple(bundled))
    if len(found.data) > LIMIT:
        raise errors.LaunchFailed(
            f"the launcher archive is {len(found.data)} bytes, over a ConfigMap's limit of "
            f"{LIMIT}; report this as a kernel-queue bug"
        )
    return found


@functools.cache
def current() -> Archive:
    """This process's archive, built once (blocking the first time: call it in a thread)."""
    return build()


def configmap(found: Archive, namespace: str) -> dict[str, Any]:
    """The ConfigMap carrying ``found`` in ``namespace``, with our managed-by labels."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": found.name,
            "namespace": namespace,
            "labels": {
                kueue.MANAGED_BY_LABEL: kueue.MANAGED_BY,
                kueue.COMPONENT_LABEL: kueue.LAUNCHER_COMPONENT,
            },
            "annotations": {
                kueue.LAUNCHER_DIGEST_ANNOTATION: f"sha256:{found.digest}",
                kueue.LAUNCHER_VERSION_ANNOTATION: _version.__version__,
            },
        },
        "immutable": True,
        "binaryData": {FILE: base64.b64encode(found.data).decode("ascii")},
    }


def holds(obj: dict[str, Any], found: Archive) -> bool:
    """True when the ConfigMap ``obj`` carries exactly ``found``'s bytes."""
    raw = (obj.get("binaryData") or {}).get(FILE)
    try:
        return isinstance(raw, str) and base64.b64decode(raw) == found.data
    except ValueError:
        return False


def mounted(pod: dict[str, Any], name: str, installed: Sequence[str]) -> dict[str, Any]:
    """``pod`` (changed in place) with ConfigMap ``name`` mounted read-only in its first
    container (ours), whose command ``installed`` (``python -m kernel_queue.launcher``) becomes
    `COMMAND`, its further arguments kept."""
    pod_spec = pod["spec"]
    volume = {
        "name": VOLUME,
        "configMap": {"name": name, "items": [{"key": FILE, "path": FILE}], "defaultMode": 0o444},
    }
    pod_spec["volumes"] = [*pod_spec.get("volumes", []), volume]
    ours = pod_spec["containers"][0]
    command = list(ours.get("command") or [])
    if command[: len(installed)] == list(installed):
        ours["command"] = [*COMMAND, *command[len(installed) :]]
    mount = {"name": VOLUME, "mountPath": MOUNT, "readOnly": True}
    ours["volumeMounts"] = [*ours.get("volumeMounts", []), mount]
    return pod


def _origin(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise errors.LaunchFailed(f"cannot find the installed module {module} to deliver")
    return Path(spec.origin)


def _relative(module: str, origin: Path) -> str:
    stem = module.replace(".", "/")
    return f"{stem}/__init__.py" if origin.name == "__init__.py" else f"{stem}.py"


def _add_package(out: zipfile.ZipFile, folder: Path, into: str) -> None:
    """Every ``.py`` file of ``folder`` and its subpackages, but no tests or caches."""
    for source in sorted(folder.rglob("*.py")):
        parts = source.relative_to(folder).parts
        if any(part in ("tests", "__pycache__") for part in parts[:-1]):
            continue
        _add(out, f"{into}/{'/'.join(parts)}", source.read_bytes())


def _add(out: zipfile.ZipFile, name: str, data: bytes) -> None:
    """``data`` at ``name``, and for a module its bytecode at ``name`` + ``c``."""
    _write(out, name, data)
    if name.endswith(".py"):
        _write(out, f"{name}c", _bytecode(name, data))


def _write(out: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, _STAMP)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    out.writestr(info, data)


def _bytecode(name: str, source: bytes) -> bytes:
    """The module's code as an unchecked hash-based ``.pyc`` (PEP 552): nothing in it depends
    on a time, and zipimport loads it without reading the source. Compiled under the path
    zipimport gives it in a pod, so tracebacks name the same file either way."""
    code = compile(source, f"{PATH}/{name}", "exec", dont_inherit=True, optimize=0)
    header = importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little")
    return header + importlib.util.source_hash(source) + marshal.dumps(code)


def _library_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"
