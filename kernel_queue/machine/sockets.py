"""The service's Unix socket: binding it (private, or shared by every user) and asking the
kernel who is at the other end of a connection (SO_PEERCRED).

A user's own service listens on a 0600 socket in a 0700 directory; the system service on a
0666 socket in a 0755 directory, since every user connects and each request is told apart by
the peer's credentials, never by what the client says. Blocking calls only: the service binds
before it serves and reads credentials, which the kernel answers at once, per connection.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from pathlib import Path

log = logging.getLogger("kernel_queue.machine")

SYSTEM_SOCKET = Path("/run/kernel-queue/queue.sock")
"""Where the system service listens (systemd's RuntimeDirectory=kernel-queue); clients look
there first, at the path in KERNEL_QUEUE_SYSTEM_SOCKET when that is set (tests)."""


class AlreadyRunning(RuntimeError):
    """Another service answers on the socket: this one has nothing to do."""


def bind(path: Path, *, shared: bool = False) -> socket.socket:
    """The listening socket at `path`: in a 0700 directory and 0600 (`shared`: 0755 and 0666).
    A stale socket file (no service answers) is replaced, a live one raises AlreadyRunning."""
    directory_mode, socket_mode = (0o755, 0o666) if shared else (0o700, 0o600)
    path.parent.mkdir(mode=directory_mode, parents=True, exist_ok=True)
    os.chmod(path.parent, directory_mode)
    if path.is_socket() or path.is_symlink():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except (ConnectionRefusedError, FileNotFoundError):
                log.info("replacing the stale socket %s", path)
                path.unlink(missing_ok=True)
            else:
                raise AlreadyRunning(f"a kernel-queue service already answers on {path}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)  # never a moment where the socket is more open than it ends up
    try:
        listener.bind(str(path))
    finally:
        os.umask(umask)
    os.chmod(path, socket_mode)
    listener.listen(128)
    return listener


def peer(sock: socket.socket) -> tuple[int, int, int]:
    """The connected client's pid, uid and gid, as the kernel reports them (SO_PEERCRED): what
    the client was when it connected, whatever it says in its hello."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid
