"""A command on a pseudo-terminal, driven like a person at a keyboard (no pexpect).

The child gets the pty as stdin, stdout, stderr *and* controlling terminal (a new
session, then ``TIOCSCTTY``), so ``isatty()`` is true and ``getpass`` reads from
``/dev/tty`` without echo — exactly as in a real terminal.

    term = PtySession.spawn([sys.executable, "-m", "mnemo", "setup"], env=env)
    await term.expect("API key")
    term.send("sk-test")
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import select
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


class PtySession:
    def __init__(self, proc: subprocess.Popen[bytes], master: int) -> None:
        self.proc = proc
        self.master = master
        self.output = ""  # everything read so far
        self._pos = 0  # where the next expect starts looking

    @classmethod
    def spawn(cls, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None) -> PtySession:
        master, slave = os.openpty()

        def controlling_tty() -> None:  # runs in the child, after setsid
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        proc = subprocess.Popen(
            list(argv),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=controlling_tty,  # only an ioctl: safe between fork and exec
        )
        os.close(slave)
        return cls(proc, master)

    def _read(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([self.master], [], [], min(left, 0.2))
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # the child closed the terminal
            return False
        if not data:
            return False
        self.output += data.decode("utf-8", "replace").replace("\r\n", "\n")
        return True

    def _until(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = pattern.search(self.output, self._pos)
            if found:
                self._pos = found.end()
                return found
            if not self._read(deadline):
                raise AssertionError(f"never saw {pattern.pattern!r}; the terminal showed:\n{self.output}")

    async def expect(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """Wait (off the event loop, so in-process fake servers keep serving) for
        ``pattern`` (a regular expression) after the previous match."""
        return await asyncio.to_thread(self._until, re.compile(pattern), timeout)

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\r")

    async def wait(self, timeout: float = 60.0) -> int:
        def drain() -> int:
            deadline = time.monotonic() + timeout
            while self._read(deadline):
                pass
            return self.proc.wait(max(0.1, deadline - time.monotonic()))

        try:
            return await asyncio.to_thread(drain)
        finally:
            os.close(self.master)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
