"""A local kernel's five loopback ports, held by the server from submit to release.

While the kernel waits (queued, or preempted and requeued) each port is a listening socket of
the server, so no other process can bind it. Just before the launcher starts, the sockets stop
listening but stay bound with SO_REUSEADDR: the kernel's ZMQ sockets (SO_REUSEADDR too) can then
bind and listen, a process binding without SO_REUSEADDR is still refused, and once the kernel
listens nobody can. When the kernel exits they listen again. Non-blocking socket calls only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import sys

NAMES = ("shell", "iopub", "stdin", "control", "hb")
_BACKLOG = 16  # connections a held port queues (never accepted) until the kernel takes over


class _SockAddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_char * 14)]


def _load_connect() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).connect
    except (OSError, AttributeError):
        return None


_connect = _load_connect()


def _stop_listening(sock: socket.socket) -> bool:
    """Linux: `connect(AF_UNSPEC)` turns a listening TCP socket back into a bound one (the port
    stays bound because it was bound explicitly). False where that is not available."""
    if _connect is None:
        return False
    address = _SockAddr(socket.AF_UNSPEC)
    return int(_connect(sock.fileno(), ctypes.byref(address), ctypes.sizeof(address))) == 0  # type: ignore[operator]


def _family(ip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def _bound(ip: str, port: int) -> socket.socket:
    sock = socket.socket(_family(ip), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setblocking(False)
        sock.bind((ip, port))
    except OSError:
        sock.close()
        raise
    return sock


class HeldPorts:
    """The ports of one kernel and the server's sockets on them (None where not held now)."""

    def __init__(self, ip: str, ports: tuple[int, ...]) -> None:
        self.ip = ip
        self.ports = ports
        self._sockets: list[socket.socket | None] = [None] * len(ports)

    @classmethod
    def new(cls, ip: str, count: int = len(NAMES)) -> HeldPorts:
        """`count` distinct ports the OS picks on `ip`, held (listening) at once; OSError if the
        server cannot open that many sockets."""
        picks: list[socket.socket] = []
        held = cls(ip, ())
        try:
            for _ in range(count):
                picks.append(_bound(ip, 0))
            held.ports = tuple(s.getsockname()[1] for s in picks)
            held._sockets = [None] * count
            # Bind each port again by number: only an explicitly bound port survives the
            # switch from listening to bound in `lend`.
            for index, port in enumerate(held.ports):
                sock = _bound(ip, port)
                held._sockets[index] = sock
                sock.listen(_BACKLOG)
        except OSError:
            held.close()
            raise
        finally:
            for sock in picks:
                sock.close()
        return held

    def hold(self) -> list[int]:
        """Listen on every port again (a kernel's exit, a requeue, an admission); return the
        ports another process has taken meanwhile, which stay unheld."""
        taken = []
        for index, port in enumerate(self.ports):
            sock = self._sockets[index]
            try:
                if sock is None:
                    sock = self._sockets[index] = _bound(self.ip, port)
                sock.listen(_BACKLOG)
            except OSError as exc:  # out of descriptors: unheld now, tried again next time
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    taken.append(port)
        return taken

    def lend(self) -> None:
        """Let the kernel bind the ports: stop listening, stay bound (or close, off Linux)."""
        for index, sock in enumerate(self._sockets):
            if sock is not None and not _stop_listening(sock):
                sock.close()
                self._sockets[index] = None

    def close(self) -> None:
        """Give the ports back to the system."""
        for sock in self._sockets:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        self._sockets = [None] * len(self.ports)

    def describe(self, ports: list[int]) -> str:
        """ "port 40123 (shell) on 127.0.0.1", or "ports 40123 (shell), 40124 (iopub) on …",
        with the process that listens there where /proc names it ("held by pid 77: nc")."""
        holders = _holders(ports)
        named = [
            f"{p} ({NAMES[self.ports.index(p)]}{holders.get(p, '')})"
            for p in ports
            if p in self.ports
        ]
        noun = "port" if len(named) == 1 else "ports"
        return f"{noun} {', '.join(named)} on {self.ip}"


def _holders(ports: list[int]) -> dict[int, str]:
    """Port -> "; held by pid 77: nc -l 40123" for the listening TCP sockets /proc shows on
    `ports` (Linux, processes this user may read); {} where none can be named."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as lines:
            next(lines, None)
            for line in lines:
                fields = line.split()
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if port in ports and fields[3] == "0A":  # LISTEN
                    inodes[f"socket:[{fields[9]}]"] = port
    found: dict[int, str] = {}
    if not inodes:
        return found
    with contextlib.suppress(OSError):
        for pid in (entry for entry in os.listdir("/proc") if entry.isdigit()):
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    held = inodes.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
                    if held is None or held in found or int(pid) == os.getpid():
                        continue
                    with open(f"/proc/{pid}/cmdline", "rb") as raw:
                        command = raw.read().replace(b"\0", b" ").decode(errors="replace")
                    found[held] = f"; held by pid {pid}: {command.strip()[:80]}"
    return found
