"""`python -m kernel_queue_fake_cluster.node`: run a node agent as its own process.

    python -m kernel_queue_fake_cluster.node --kubeconfig FILE --node-name NAME --root DIR \\
        [--gpus N] [--cpu C] [--memory M] [--pods P] [--image-path PATTERN=DIR ...] \\
        [--missing-image PATTERN ...] [--bind] [--kubelet-port PORT | --no-kubelet-server] \\
        [--context NAME]

It registers Node NAME with the API server the kubeconfig names and runs the pods bound to it
(`--bind`: it binds ungated pods itself, for a plane without a scheduler), until SIGTERM or
SIGINT: then it kills every pod process group and removes what it made under DIR except the
claims' directories (`DIR/pvc`), and exits 0. It prints one line, `node agent NAME ready
(kubelet port PORT)`, once it runs pods.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from kernel_queue_fake_cluster.node.agent import NODE_NAME, NodeAgent
from kernel_queue_fake_cluster.node.client import ClientConfig
from kernel_queue_fake_cluster.node.registration import GPUS, Capacity


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m kernel_queue_fake_cluster.node",
        description="A node agent: runs its pods as local processes, through the Kubernetes API.",
    )
    parser.add_argument("--kubeconfig", required=True, help="the API server and credentials")
    parser.add_argument("--context", help="the kubeconfig's context (default: its current one)")
    parser.add_argument("--node-name", default=NODE_NAME, help=f"default: {NODE_NAME}")
    parser.add_argument("--root", required=True, help="where pods' files and claims go")
    parser.add_argument("--gpus", type=int, default=GPUS, help="nvidia.com/gpu the Node offers")
    parser.add_argument("--cpu", help="CPUs the Node offers (default: this machine's)")
    parser.add_argument("--memory", help="memory the Node offers, e.g. 64Gi (default: this one's)")
    parser.add_argument("--pods", type=int, default=110, help="pods the Node offers")
    parser.add_argument(
        "--image-path",
        action="append",
        default=[],
        metavar="PATTERN=DIR",
        help="containers of images matching PATTERN (fnmatch) get DIR first on PATH",
    )
    parser.add_argument(
        "--missing-image",
        action="append",
        default=[],
        metavar="PATTERN",
        help="images matching PATTERN (fnmatch) are in no registry: their pull fails",
    )
    parser.add_argument(
        "--bind", action="store_true", help="bind ungated pods itself (no scheduler)"
    )
    parser.add_argument(
        "--kubelet-port",
        type=int,
        default=0,
        help="HTTPS port of /containerLogs (the Node's kubelet endpoint; 0: any free one)",
    )
    parser.add_argument(
        "--no-kubelet-server", action="store_true", help="serve no /containerLogs endpoint"
    )
    parser.add_argument("--pod-ip-pool", default="127.10.0.0/16", help="loopback pod IPs")
    parser.add_argument("--verbose", "-v", action="store_true")
    return parser.parse_args(argv)


def image_paths(pairs: Sequence[str]) -> dict[str, str]:
    found = {}
    for pair in pairs:
        pattern, sep, folder = pair.partition("=")
        if not sep or not pattern or not folder:
            raise SystemExit(f"--image-path wants PATTERN=DIR, not {pair!r}")
        found[pattern] = folder
    return found


async def serve(options: argparse.Namespace, root: Path) -> None:
    capacity = Capacity(
        cpu=options.cpu, memory=options.memory, pods=options.pods, gpus=options.gpus
    )
    agent = NodeAgent(
        ClientConfig.from_kubeconfig(options.kubeconfig, options.context),
        root,
        node_name=options.node_name,
        bind=options.bind,
        capacity=capacity,
        image_paths=image_paths(options.image_path),
        pod_ip_pool=options.pod_ip_pool,
        logs_port=None if options.no_kubelet_server else options.kubelet_port,
    )
    for pattern in options.missing_image:
        agent.fail_image(image=pattern)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.start()
        print(
            f"node agent {options.node_name} ready (kubelet port {agent.kubelet_port})", flush=True
        )
        await stop.wait()
    finally:
        await agent.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    logging.basicConfig(
        level=logging.DEBUG if options.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    root = Path(options.root)
    made = not root.exists()
    try:
        asyncio.run(serve(options, root))
    finally:
        shutil.rmtree(root / "tls", ignore_errors=True)
        if made:  # nothing but claims' directories stays
            for empty in (root / "pods", root):
                with contextlib.suppress(OSError):
                    empty.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
