"""``mnemo ARGV`` in this process: what a subprocess would give (exit code, stdout,
stderr) without paying for a new interpreter and its imports.

Use it where a real process proves nothing. Keep a subprocess where the process
boundary is the thing under test: exit codes from the installed entry point, signals
and kill -9, pipes (EPIPE, ``| head``), undecodable argv/stdin bytes, mount
namespaces, import cost, a running service.

Like a subprocess, each call gets its own environment (``MNEMO_HOME`` and the
caller's variables; none of the host's ``HOST_PREFIXES`` variables leaks in), its own
stdin/stdout/stderr (UTF-8, not a terminal) and leaves the logging configuration as it
found it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from mnemo.cli.main import main
from mnemo.gateway.logs import configure_logging

# Variables a test's mnemo must not inherit from the host: the platforms', the LLM's and
# the memory providers' settings and keys.
HOST_PREFIXES = (
    "ANTHROPIC_",
    "TELEGRAM_",
    "DISCORD_",
    "MNEMO_",
    "MEM0_",
    "HONCHO_",
    "HINDSIGHT_",
    "SUPERMEMORY_",
    "RETAINDB_",
    "BYTEROVER_",
    "OPENVIKING_",
)


@dataclass(frozen=True)
class Result:
    """The shape of ``subprocess.CompletedProcess`` the tests read."""

    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` without the host's mnemo variables, plus ``values``; restored after."""
    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if n.startswith(HOST_PREFIXES)]:
            del os.environ[name]
        os.environ.update(values)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """The root logger's handlers and levels and structlog's configuration as they were:
    ``main`` configures logging for the process it believes it owns."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {
        name: logger.level
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    config = structlog.get_config()
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
        for name, logger in logging.root.manager.loggerDict.items():
            if isinstance(logger, logging.Logger):
                logger.setLevel(levels.get(name, logging.NOTSET))
        structlog.configure(**config)


def structlog_through_logging() -> None:
    """Route structlog through stdlib logging as every mnemo program does
    (gateway/logs.py), adding no handler and changing no level: the test session's
    baseline. Unconfigured, structlog prints every event to stdout (into the output a
    CLI test reads), and only until some earlier test happened to configure logging."""
    with logging_restored():
        configure_logging()
        config = structlog.get_config()
    structlog.configure(**config)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _text_stream(data: bytes = b"") -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="strict", newline=None)


def _read(stream: io.TextIOWrapper) -> str:
    stream.flush()
    raw = stream.buffer
    assert isinstance(raw, io.BytesIO)
    return raw.getvalue().decode("utf-8", errors="replace")


def run_mnemo(home: Path | None, *argv: str, stdin: str = "", **env: str) -> Result:
    """``MNEMO_HOME=home mnemo ARGV < stdin`` with ``env`` added to the environment.

    Called from a coroutine (an event loop runs in this thread), the command runs on a
    thread of its own while this one waits: it blocks the caller's loop exactly as
    ``subprocess.run`` would, and ``main`` gets the loop-free thread it needs."""
    if _loop_running():
        results: list[Result] = []
        errors: list[BaseException] = []

        def call() -> None:
            try:
                results.append(run_mnemo(home, *argv, stdin=stdin, **env))
            except BaseException as e:  # re-raised in the caller's thread
                errors.append(e)

        worker = threading.Thread(target=call, name="mnemo-cli")
        worker.start()
        worker.join()
        if errors:
            raise errors[0]
        return results[0]
    values = {"PYTHONIOENCODING": "utf-8", **env}
    if home is not None:
        values["MNEMO_HOME"] = str(home)
    out, err = _text_stream(), _text_stream()
    saved = sys.stdin, sys.stdout, sys.stderr
    with environment(values), logging_restored():
        sys.stdin, sys.stdout, sys.stderr = _text_stream(stdin.encode()), out, err
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse: --help, --version, usage errors
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
            if isinstance(e.code, str):
                print(e.code, file=err)
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved
    return Result(code, _read(out), _read(err))
