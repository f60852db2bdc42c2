"""`python -m kernel_queue_fake_cluster.control_plane build|start` (scripts/control-plane).

`build` builds what the cache lacks (`build.py`). `start` starts a plane with one Kueue release,
applies the repository's queues and RBAC (etc/kubernetes), prints how to use it (kubectl, a
kubeconfig for kernel-queue's server) and runs until Ctrl-C or SIGTERM, then stops everything.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import yaml

from kernel_queue_fake_cluster.control_plane import build, releases
from kernel_queue_fake_cluster.control_plane.plane import ControlPlane, NodeSpec, PlaneError
from kernel_queue_fake_cluster.kueue import conversion


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/control-plane",
        description="Build (from Go modules) and start the real control plane kernel-queue's "
        "kube tests run on: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, "
        "Kueue and a node agent that runs pods as local processes.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build what the cache lacks (about 17 min the first time)")
    commands.add_parser("built", help="exit 0 when the cache holds a whole plane, else 1")
    commands.add_parser("cache", help="print the cache's folder")
    start = commands.add_parser("start", help="start a plane and run until Ctrl-C")
    start.add_argument("--kueue", default="0.19", choices=sorted(releases.KUEUE))
    start.add_argument("--gpus", type=int, default=2, help="the node's nvidia.com/gpu (2)")
    start.add_argument("--root", type=Path, help="keep the plane's files here (logs, pki)")
    start.add_argument(
        "--etc",
        type=Path,
        default=Path(__file__).resolve().parents[5] / "etc" / "kubernetes",
        help="apply queues.yaml and rbac.yaml from this folder (the repository's etc/kubernetes)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "built":
        return 0 if build.built() is not None else 1
    if args.command == "cache":
        print(build.cache_dir())
        return 0
    try:
        if args.command == "build":
            found = build.build()
            print(f"control plane built in {found.kubernetes.parent.parent}")
            return 0
        build.build()
        return _start(args)
    except (build.BuildError, PlaneError) as exc:
        print(f"control plane: {exc}", file=sys.stderr)
        return 1


def _start(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    plane = ControlPlane(
        kueue=args.kueue,
        root=args.root,
        node=NodeSpec(gpus=args.gpus),
        keep=bool(args.root),
        say=print,
    )
    with plane:
        version = "kueue.x-k8s.io/" + ("v1beta1" if args.kueue == "0.14" else "v1beta2")
        queues = yaml.safe_load_all((args.etc / "queues.yaml").read_text())
        plane.admin.apply([conversion.convert(doc, version) for doc in queues if doc])
        plane.admin.apply(
            [d for d in yaml.safe_load_all((args.etc / "rbac.yaml").read_text()) if d]
        )
        token = plane.service_account_token("default", "kernel-queue")
        server = plane.kubeconfig_for(token, name="server-kubeconfig")
        kubectl = plane.binaries.binary("kubectl")
        print(
            f"\nKubernetes {releases.KUBERNETES} and Kueue {plane.release.version} run at "
            f"{plane.url}"
            f"\n  admin:  {kubectl} --kubeconfig {plane.kubeconfig} get pods,workloads -A"
            f"\n  server: c.KubernetesBackend.kubeconfig = {str(server)!r} (the kernel-queue "
            "service account of etc/kubernetes/rbac.yaml)"
            f"\n  logs:   {plane.root / 'logs'}"
            "\nCtrl-C stops it and removes everything it made.",
            flush=True,
        )
        stop.wait()
        print("stopping the control plane")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
