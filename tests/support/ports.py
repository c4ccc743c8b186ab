"""TCP ports a test must name before anything listens on them (a webhook URL written
into the settings, a replica's web port, a server that is down at first).

Binding port 0, closing the socket and handing the number on is a race once tests run
in parallel: until the new owner binds it, the kernel may give the same port to any
other process for its own port-0 bind or outgoing connection. ``reserve_port`` avoids
both ways of colliding:

* its ports lie outside the kernel's ephemeral range (``ip_local_port_range``), which
  port-0 binds and outgoing connections draw from, so the kernel never hands them out;
* each one is held by an ``flock`` on ``$TMPDIR/mnemo-test-ports/<port>.lock`` for the
  life of the test process, so no other pytest worker or run on this machine takes it
  (the kernel drops the lock when the process dies, however it dies);

and a port something else is listening on is skipped (checked by binding it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

LOCK_DIR = Path(tempfile.gettempdir()) / "mnemo-test-ports"
LOWEST = 20_000  # below: well-known services' habits (8080, 5432, ...)
_held: dict[int, int] = {}  # port -> the fd of its lock, open until this process exits


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def candidates() -> list[int]:
    low, high = ephemeral_range()
    ports = [p for p in range(LOWEST, 65536) if not low <= p <= high]
    random.Random(os.getpid()).shuffle(ports)
    return ports


def _lock(port: int) -> int | None:
    LOCK_DIR.mkdir(exist_ok=True)
    with contextlib.suppress(OSError):
        LOCK_DIR.chmod(0o1777)  # shared by every user's test runs, like /tmp
    fd = os.open(LOCK_DIR / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_port() -> int:
    """A port on 127.0.0.1 that nothing listens on and no other test will be given."""
    for port in candidates():
        if port in _held:
            continue
        fd = _lock(port)
        if fd is None:
            continue
        if not _bindable(port):
            os.close(fd)
            continue
        _held[port] = fd
        return port
    raise RuntimeError(f"no free port outside the ephemeral range {ephemeral_range()}")
