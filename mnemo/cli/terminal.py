"""What the CLI shows on a terminal besides its output: a spinner while it waits.

Signs of life go to stderr and only when stderr is a terminal, so piped or redirected
output (and a log file) never holds a spinner frame; stdout stays the command's answer.

    with spinner("checking"):
        checks = asyncio.run(run_checks(settings))

The spinner runs on its own thread (owned by the context manager, joined on exit), so
it keeps turning while the main thread blocks in ``asyncio.run`` or a SQLite call, and
erases its line when done.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
ASCII_FRAMES = "|/-\\"
INTERVAL_S = 0.1
_ERASE = "\r\x1b[K"


_COLORS = {"green": "32", "red": "31", "dim": "2"}


def colored(stream: TextIO | None) -> bool:
    """Colour on ``stream``: a terminal, and neither ``NO_COLOR`` nor ``TERM=dumb``."""
    from mnemo.gateway.config import wants_color

    return is_terminal(stream) and wants_color()


def paint(text: str, color: str, on: bool) -> str:
    return f"\x1b[{_COLORS[color]}m{text}\x1b[0m" if on else text


def is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # closed or detached
        return False


def _frames(stream: TextIO) -> str:
    try:
        FRAMES.encode(stream.encoding or "ascii")
        return FRAMES
    except (UnicodeEncodeError, LookupError):
        return ASCII_FRAMES


class Spinner:
    """One line on ``stream`` (``"⠋ message…"``), redrawn every ``INTERVAL_S``; ``update``
    changes the message. Does nothing at all when ``stream`` is not a terminal."""

    def __init__(self, message: str, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.active = is_terminal(self.stream)
        self._message = message
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def update(self, message: str) -> None:
        self._message = message

    def start(self) -> None:
        if self.active and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._spin, name="mnemo-spinner", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        self._write(_ERASE)

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):
                self._stop.set()  # the terminal went away: stop quietly

    def _spin(self) -> None:
        frames = _frames(self.stream)
        i = 0
        while not self._stop.is_set():
            self._write(f"{_ERASE}{frames[i % len(frames)]} {self._message}…")
            i += 1
            self._stop.wait(INTERVAL_S)

    def __enter__(self) -> Spinner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def spinner(message: str, stream: TextIO | None = None) -> Iterator[Spinner]:
    """A ``Spinner`` for the duration of the block (a no-op off a terminal)."""
    with Spinner(message, stream) as s:
        yield s


def progress(count: int, every: int, what: str, stream: TextIO | None = None) -> None:
    """``mnemo: 100 lines answered`` on stderr every ``every`` items, on a terminal only."""
    stream = stream if stream is not None else sys.stderr
    if every > 0 and count > 0 and count % every == 0 and is_terminal(stream):
        stream.write(f"{_ERASE}mnemo: {count:,} {what}\n")
        stream.flush()


class ProgressBar:
    """``[######..................]  25%  messages 6,750/27,000`` on one line of
    ``stream``, redrawn at most every ``INTERVAL_S`` (and at 100 %), erased by ``close``.
    Like the spinner it draws nothing at all when ``stream`` is not a terminal."""

    WIDTH = 24

    def __init__(self, stream: TextIO | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.active = is_terminal(self.stream)
        self._clock = clock
        self._last = -INTERVAL_S
        self._drawn = False

    def update(self, label: str, done: int, total: int) -> None:
        if not self.active:
            return
        now = self._clock()
        if done < total and now - self._last < INTERVAL_S:
            return
        self._last = now
        frac = 1.0 if total <= 0 else min(done / total, 1.0)
        full = int(frac * self.WIDTH)
        bar = "#" * full + "." * (self.WIDTH - full)
        try:
            self.stream.write(f"{_ERASE}[{bar}] {frac:4.0%}  {label} {done:,}/{total:,}")
            self.stream.flush()
            self._drawn = True
        except (OSError, ValueError):
            self.active = False  # the terminal went away

    def close(self) -> None:
        if self._drawn:
            try:
                self.stream.write(_ERASE)
                self.stream.flush()
            except (OSError, ValueError):
                pass  # the terminal went away: nothing left to erase
            self._drawn = False
