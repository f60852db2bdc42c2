"""A representative kernel's GroupSpec (one GPU, namespace team-a, the server's environment in
it that must never reach a pod), for the golden manifests and whatever reads a spec."""

from __future__ import annotations

from kernel_queue.model import ConnectionInfo, GroupSpec

KERNEL_ID = "1a2b3c4d-5e6f-4a0b-8c9d-0e1f2a3b4c5d"
KEY = "0f1e2d3c4b5a69788796a5b4c3d2e1f0-secret-key"
GROUP = "kq-1a2b3c4d5e6f4a0b8c9d0e1f2a3b4c5d"

SPEC = GroupSpec(
    kernel_id=KERNEL_ID,
    queue="user-queue",
    argv=("python", "-m", "ipykernel_launcher", "-f", "{connection_file}"),
    connection=ConnectionInfo("127.0.0.1", 0, 0, 0, 0, 0, key=KEY),
    kernelspec="python3-gpu-queued",
    gpus=1,
    user="alice",
    grace_seconds=30.0,
    namespace="team-a",
    image="registry.example/kernel:1.0",
    # The server's environment, which must never reach a pod.
    env={"PATH": "/server/bin", "JUPYTER_TOKEN": "server-token"},
)
