"""Build the real control plane from Go modules into a cache outside the repository.

Nothing here is downloaded but Go modules (no release binaries can be fetched on our
machines), and nothing built is committed. Each part is built once per version into its own
folder of the cache, `<cache>/<part>-<version>/`, marked done by `built.json`; a second run finds
it and takes a second. The first takes about 17 minutes on two cores (Kubernetes about 7,
etcd 1, each Kueue 4 to 5); the Go module and build caches (`go env GOMODCACHE GOCACHE`) make a
rebuild after a version change faster.

- Kubernetes (`releases.KUBERNETES`): `k8s.io/kubernetes` cannot be `go install`ed (its go.mod
  requires each staging module at v0.0.0 and replaces it with a folder of its own repository),
  so a wrapper module of ours requires it and replaces every staging module its go.mod lists
  with the published v0.X.Y; our tiny mains (`modules/kubernetes/*/main.go`) build
  kube-apiserver, kube-controller-manager, kube-scheduler and kubectl, the version set through
  `-ldflags` on `k8s.io/component-base/version` (clients and Kueue parse it).
- etcd (`releases.ETCD`): its server module has replace directives too; our main
  (`modules/etcd/main.go`) calls its `etcdmain`.
- Kueue (`releases.KUEUE`): `go install sigs.k8s.io/kueue/cmd/kueue@version`; its CRDs, webhook
  manifests and visibility APIServices are copied from that release's module into
  `<cache>/kueue-<version>/config/`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kernel_queue_fake_cluster.control_plane import releases

MODULES = Path(__file__).resolve().parent / "modules"
"""Our Go sources: the wrapper modules' mains (the go.mod files are written at build time)."""
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
CACHE_ENV = "KERNEL_QUEUE_CONTROL_PLANE_CACHE"
FIRST_BUILD = {"kubernetes": "about 7 min", "etcd": "about 1 min", "kueue": "about 5 min"}
"""How long a first build of each part takes on two cores (measured), said before it starts."""
KUEUE_CONFIG = (
    "config/components/crd/bases",
    "config/components/crd/kustomization.yaml",
    "config/components/crd/patches",
    "config/components/webhook/manifests.yaml",
    "config/components/visibility/apiservice_v1beta1.yaml",
    "config/components/visibility/apiservice_v1beta2.yaml",
)
"""What of a Kueue release's module the control plane reads (absent ones are skipped)."""


class BuildError(RuntimeError):
    """A part could not be built; the message says which and why, with what to do."""


def cache_dir() -> Path:
    """`$KERNEL_QUEUE_CONTROL_PLANE_CACHE`, else `$XDG_CACHE_HOME/kernel-queue/control-plane`
    (`~/.cache/...`)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernel-queue" / "control-plane"


@dataclass(frozen=True)
class Binaries:
    """Where the built control plane lies."""

    kubernetes: Path
    """The folder of kube-apiserver, kube-controller-manager, kube-scheduler and kubectl."""
    etcd: Path
    """The etcd binary."""
    kueue: dict[str, Path]
    """Release line ("0.14") -> the folder holding `bin/kueue` and `config/`."""

    def binary(self, name: str) -> Path:
        return self.kubernetes / name


def missing_go() -> str | None:
    """Why Go cannot build the control plane here (a sentence), or None when it can."""
    go = shutil.which("go")
    if go is None:
        return (
            "Go is not installed: the real control plane (kube-apiserver, etcd, Kueue) is built "
            "from Go modules; install Go "
            + ".".join(map(str, releases.GO_MINIMUM))
            + " or newer and reach the Go module proxy"
        )
    found = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False)
    match = re.match(r"go(\d+)\.(\d+)", found.stdout.strip())
    if match is None or tuple(map(int, match.groups())) < releases.GO_MINIMUM:
        need = ".".join(map(str, releases.GO_MINIMUM))
        here = found.stdout.strip()
        return f"Go {need} or newer is needed to build Kueue 0.19; `go` here is {here!r}"
    return None


def built(cache: Path | None = None) -> Binaries | None:
    """The control plane if every part is in the cache, else None (nothing is built)."""
    cache = cache or cache_dir()
    found = _paths(cache)
    parts = [found.kubernetes.parent, found.etcd.parent.parent, *found.kueue.values()]
    return found if all((part / "built.json").exists() for part in parts) else None


def _paths(cache: Path) -> Binaries:
    return Binaries(
        kubernetes=cache / f"kubernetes-{releases.KUBERNETES}" / "bin",
        etcd=cache / f"etcd-{releases.ETCD}" / "bin" / "etcd",
        kueue={
            name: cache / f"kueue-{release.version}" for name, release in releases.KUEUE.items()
        },
    )


def build(cache: Path | None = None, say: Callable[[str], None] = print) -> Binaries:
    """Build what the cache lacks (saying what and about how long), return where it lies.
    One build at a time per cache: another process's build (`scripts/test` starts one in the
    background) is waited for, and what it built is not built again. Raises `BuildError` with
    the failing command's output."""
    cache = cache or cache_dir()
    found = _paths(cache)
    if built(cache) is not None:
        return found
    why = missing_go()
    if why is not None:
        raise BuildError(why)
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".build.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another build of the control plane in {cache} to end")
            fcntl.flock(lock, fcntl.LOCK_EX)
        _part(cache, "kubernetes", releases.KUBERNETES, say, _build_kubernetes)
        _part(cache, "etcd", releases.ETCD, say, _build_etcd)
        for release in releases.KUEUE.values():
            _part(cache, "kueue", release.version, say, _build_kueue)
    return found


def _part(
    cache: Path,
    part: str,
    version: str,
    say: Callable[[str], None],
    make: Callable[[Path, str, Callable[[str], None]], None],
) -> None:
    folder = cache / f"{part}-{version}"
    stamp = folder / "built.json"
    if stamp.exists():
        return
    say(f"building {part} {version} into {folder} (first time: {FIRST_BUILD[part]})")
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "bin").mkdir(parents=True)
    started = time.monotonic()
    make(folder, version, say)
    seconds = round(time.monotonic() - started, 1)
    sizes = {p.name: p.stat().st_size for p in sorted((folder / "bin").iterdir())}
    go = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=False)
    record = {"version": version, "go": go.stdout.strip(), "seconds": seconds, "sizes": sizes}
    stamp.write_text(json.dumps(record, indent=1) + "\n")
    say(f"built {part} {version} in {seconds:.0f} s")


def _go_env() -> dict[str, str]:
    env = dict(os.environ, CGO_ENABLED="0", GOWORK="off", GOTOOLCHAIN="local")
    env.pop("GOFLAGS", None)
    return env


def _run(command: Iterable[str], cwd: Path, what: str, env: dict[str, str] | None = None) -> str:
    args = list(command)
    done = subprocess.run(
        args, cwd=cwd, env=env or _go_env(), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-25:]
        raise BuildError(
            f"{what} failed ({' '.join(args)}, exit {done.returncode}):\n" + "\n".join(tail)
        )
    return done.stdout


def _module_info(module: str, cwd: Path) -> dict[str, str]:
    """`go mod download -json module@version`: its Dir, GoMod, Version."""
    text = _run(["go", "mod", "download", "-json", module], cwd, f"downloading {module}")
    info: dict[str, str] = json.loads(text)
    if info.get("Error"):
        raise BuildError(f"the Go module proxy refused {module}: {info['Error']}")
    return info


def staging_modules(go_mod: str) -> list[str]:
    """The staging modules a k8s.io/kubernetes go.mod requires at v0.0.0 (its replaces)."""
    return sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+) v0\.0\.0\s*$", go_mod, re.MULTILINE)))


def wrapper_go_mod(module: str, kubernetes: str, go_mod: str) -> str:
    """Our wrapper module's go.mod: k8s.io/kubernetes at `kubernetes` (v1.X.Y), every staging
    module replaced with its published v0.X.Y, and that release's own go and godebug lines."""
    staging = staging_modules(go_mod)
    if not staging:
        raise BuildError(f"k8s.io/kubernetes {kubernetes}'s go.mod requires no staging module")
    published = "v0." + kubernetes.removeprefix("v1.")
    go_line = re.search(r"^go (\S+)$", go_mod, re.MULTILINE)
    godebug = re.search(r"^godebug .+$", go_mod, re.MULTILINE)
    lines = [f"module {module}", "", f"go {go_line.group(1) if go_line else '1.26.0'}", ""]
    if godebug:
        lines += [godebug.group(0), ""]
    lines += [f"require k8s.io/kubernetes {kubernetes}", "", "replace ("]
    lines += [f"\t{name} => {name} {published}" for name in staging]
    lines += [")", ""]
    return "\n".join(lines)


def _build_kubernetes(folder: Path, version: str, say: Callable[[str], None]) -> None:
    source = folder / "src"
    shutil.copytree(MODULES / "kubernetes", source)
    info = _module_info(f"k8s.io/kubernetes@{version}", source)
    go_mod = Path(info["GoMod"]).read_text()
    (source / "go.mod").write_text(wrapper_go_mod("kq-kubernetes", version, go_mod))
    say(f"resolving Kubernetes {version}'s modules")
    _run(["go", "mod", "tidy"], source, "go mod tidy (Kubernetes)")
    major, minor = version.removeprefix("v").split(".")[:2]
    flags = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    ldflags = "-s -w " + " ".join(flags)
    for name in KUBE_BINARIES:
        say(f"compiling {name}")
        command = ["go", "build", "-trimpath", "-tags", "grpcnotrace", "-ldflags", ldflags]
        _run([*command, "-o", str(folder / "bin" / name), f"./{name}"], source, f"building {name}")


def _build_etcd(folder: Path, version: str, say: Callable[[str], None]) -> None:
    source = folder / "src"
    shutil.copytree(MODULES / "etcd", source)
    (source / "go.mod").write_text("module kq-etcd\n\ngo 1.26.0\n")
    _run(["go", "get", f"go.etcd.io/etcd/server/v3@{version}"], source, "go get etcd")
    _run(["go", "mod", "tidy"], source, "go mod tidy (etcd)")
    say("compiling etcd")
    command = ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(folder / "bin" / "etcd")]
    _run([*command, "."], source, "building etcd")


def _build_kueue(folder: Path, version: str, say: Callable[[str], None]) -> None:
    module = f"sigs.k8s.io/kueue@{version}"
    info = _module_info(module, folder)
    env = dict(_go_env(), GOBIN=str(folder / "bin"))
    ldflags = f"-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion={version}"
    say(f"compiling kueue {version}")
    command = ["go", "install", "-trimpath", "-ldflags", ldflags, "sigs.k8s.io/kueue/cmd/kueue"]
    _run([*command[:-1], f"{command[-1]}@{version}"], folder, f"building kueue {version}", env)
    root = Path(info["Dir"])
    for relative in KUEUE_CONFIG:
        origin, target = root / relative, folder / relative
        if origin.is_dir():
            shutil.copytree(origin, target)
        elif origin.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(origin, target)
    for path in (folder / "config").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # module files are read-only


def main(argv: list[str] | None = None) -> int:
    """`python -m kernel_queue_fake_cluster.control_plane.build`: build what is missing."""
    del argv
    try:
        found = build()
    except BuildError as exc:
        print(f"control plane: {exc}", file=sys.stderr)
        return 1
    print(f"control plane ready: {found.kubernetes.parent.parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
