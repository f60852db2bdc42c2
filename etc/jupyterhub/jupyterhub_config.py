# kernel-queue for JupyterHub with local spawners (LocalProcessSpawner, SystemdSpawner, The
# Littlest JupyterHub): every user's server queues its kernels through the machine's one system
# queue service (etc/systemd/kernel-queue.service), and through nothing else.
#
# It sets only the users' servers' environment, so it goes with any authenticator and spawner
# settings. Use it as the whole config (`jupyterhub -f jupyterhub_config.py`), load it from
# yours (`load_subconfig("/etc/jupyterhub/kernel_queue.py")` after copying it there), or, on The
# Littlest JupyterHub, copy it to /opt/tljh/config/jupyterhub_config.d/kernel-queue.py and
# `sudo tljh-config reload hub`.
#
# The rest is outside the hub's config (README: "JupyterHub and The Littlest JupyterHub on one
# GPU box"): kernel-queue installed in the users' environment (the one whose
# jupyterhub-singleuser the spawner runs), the system service running from it, and a kernelspec
# installed into it with `<env>/bin/jupyter kernel-queue install --sys-prefix`.
#
# tests/recipes/test_jupyterhub_local.py runs a real JupyterHub with this file.
import os
import socket
import sys

c = get_config()  # type: ignore[name-defined]  # noqa: F821 - provided by traitlets

# The system service's socket; the hub's own KERNEL_QUEUE_SYSTEM_SOCKET, if set, names another
# (the test's service).
QUEUE_SOCKET = os.environ.get("KERNEL_QUEUE_SYSTEM_SOCKET") or "/run/kernel-queue/queue.sock"

# Every process of a user's server (kernels, terminals, nbconvert and papermill runs) queues
# there. KERNEL_QUEUE_SOCKET pins it: a server never starts a per-user queue, which would hand
# out the same GPUs again. While the service is down, queued kernels fail with a sentence.
c.Spawner.environment.update(
    {"KERNEL_QUEUE_SYSTEM_SOCKET": QUEUE_SOCKET, "KERNEL_QUEUE_SOCKET": QUEUE_SOCKET}
)


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


if not _answers(QUEUE_SOCKET):
    print(
        f"kernel-queue: no queue service answers on {QUEUE_SOCKET}; users' queued kernels fail "
        "until it runs: sudo systemctl enable --now kernel-queue (journalctl -u kernel-queue "
        "says why it stopped)",
        file=sys.stderr,
    )
