"""tests/support/ports.py: a reserved port is free, outside the kernel's ephemeral range,
and no other process (another xdist worker, another run) can reserve it meanwhile."""

from __future__ import annotations

import multiprocessing
import socket

from tests.support.ports import _lock, ephemeral_range, reserve_port


def _try_lock(port: int, out: multiprocessing.queues.Queue) -> None:
    fd = _lock(port)
    out.put(fd is not None)


def test_reserved_ports_are_distinct_free_and_never_ephemeral() -> None:
    low, high = ephemeral_range()
    ports = [reserve_port() for _ in range(5)]
    assert len(set(ports)) == 5
    assert not any(low <= p <= high for p in ports)
    for port in ports:
        with socket.socket() as s:  # nothing listens there: a server can have it
            s.bind(("127.0.0.1", port))


def test_another_process_cannot_take_a_reserved_port() -> None:
    port = reserve_port()
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter, like another worker
    out = ctx.Queue()
    child = ctx.Process(target=_try_lock, args=(port, out))
    child.start()
    child.join(60)
    assert out.get(timeout=5) is False
