"""Entry point of the ``mnemo`` command.

Exit codes: 0 success, 1 refused (the action was understood but not allowed or failed),
2 usage or configuration error (with a message naming the problem).

``main`` is the boundary between mnemo and the shell: the ordinary problems of a real
machine (a port already taken, a read-only or full disk, a damaged ``state.db``, a
closed pipe) become one line on stderr, ``mnemo: …``, never a traceback (``--verbose``
prints it too). Anything else is a bug and keeps its traceback.

Logging: ``mnemo run`` is a service and logs at ``logging.level`` (structured, see
``gateway/logs.py``); every other command is interactive and shows warnings and errors
only, unless ``--verbose``.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import pkgutil
import sqlite3
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

import mnemo
import mnemo.cli as cli_pkg
from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.errors import ConfigError, StartupError
from mnemo.gateway.logs import configure_logging
from mnemo.memory.errors import StoreError

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
# Long-running services keep their structured logs at logging.level.
SERVICE_COMMANDS = frozenset({"run"})


class CommandError(Exception):
    """A command failed in a way the user should read; carries the exit code."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mnemo", description="Self-hosted chat bot with layered memory.")
    parser.add_argument("--version", action="version", version=f"mnemo {mnemo.__version__}")
    parser.add_argument("--home", metavar="DIR", help="profile folder (default: $MNEMO_HOME or ~/.mnemo)")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show info logs, and the traceback behind an error"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if info.name == "main":
            continue
        module = importlib.import_module(f"{cli_pkg.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if callable(register):
            register(sub)
    for command in _subcommands(parser):
        # Also after the command (`mnemo chat -v`); SUPPRESS keeps a global -v set.
        command.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show info logs, and the traceback behind an error",
        )
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield child
                yield from _subcommands(child)


def log_level(command: str, configured: str, verbose: bool) -> str:
    """``run`` logs at ``logging.level``; interactive commands show warnings and errors
    only (their output is the conversation or the answer), unless ``--verbose``."""
    if verbose or command in SERVICE_COMMANDS:
        return configured
    return configured if configured == "error" else "warning"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, what caused it, and the members of an exception group, depth first."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)


def _sqlite_problem(e: sqlite3.Error, home: Path | None) -> str:
    text = str(e)
    where = f"a database in {home}" if home is not None else "a database"
    state_db = home / "state.db" if home is not None else Path("state.db")
    if "file is not a database" in text or "malformed" in text:
        return (
            f"{where} is damaged ({text}); `mnemo doctor` names it — restore a backup with "
            f"`mnemo import`, or move {state_db} aside to start afresh"
        )
    if "readonly database" in text or "read-only" in text:
        return f"{where} cannot be written ({text}): mnemo needs a writable home folder (--home / MNEMO_HOME)"
    if "unable to open database file" in text:
        return f"cannot open {state_db} ({text}): is {home} a writable folder?"
    if "database or disk is full" in text:
        return f"no space left for {where} ({text}): free some disk space and try again"
    if "locked" in text or "busy" in text:
        return f"{where} is locked by another process ({text}); try again in a moment"
    return f"database error: {text}"


def _os_problem(e: OSError, home: Path | None) -> str:
    name = f" {e.filename}" if e.filename else ""
    reason = e.strerror or str(e)
    folder = f" ({home})" if home is not None else ""
    if e.errno == errno.EADDRINUSE:
        return f"address already in use{name}: another program is listening there"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied:{name} — mnemo needs to read and write its home folder{folder}"
    if e.errno == errno.EROFS:
        return (
            f"read-only file system:{name} — mnemo needs a writable home folder{folder} (--home / MNEMO_HOME)"
        )
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device:{name} — free some disk space and try again"
    if e.errno == errno.ENOTDIR:
        return f"{(e.filename or 'a path')}: a file is in the way where a folder is expected"
    if e.errno == errno.EISDIR:
        return f"{(e.filename or 'a path')} is a folder, not a file"
    return f"{reason}:{name}" if name else reason


def explain(exc: BaseException, home: Path | None = None) -> str | None:
    """The one line an ordinary environment problem deserves, or None for a bug."""
    chain = list(_chain(exc))
    for e in chain:  # the root cause names the problem best
        if isinstance(e, sqlite3.Error):
            return _sqlite_problem(e, home)
    for e in chain:
        if isinstance(e, OSError):
            return _os_problem(e, home)
    for e in chain:
        if isinstance(e, StoreError):
            return str(e)
    return None


def _quiet_stdout() -> None:
    """The reader of our stdout went away (``mnemo doctor | head -1``): stop writing,
    the Unix way, and keep the interpreter's final flush from complaining."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass  # stdout is not a real file: nothing will be flushed into a closed pipe


def _fail(message: str, code: int, exc: BaseException, verbose: bool) -> int:
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"mnemo: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))
    home: Path | None = None
    try:
        try:
            settings: Settings = load_settings(args.home)
            # cron.jobs are checked by the cron sub-system's parser, once the command is
            # known (``--help`` exits before: it imports none of it).
            from mnemo.gateway.cron.service import check_declared_jobs

            check_declared_jobs(settings)
        except ConfigError as e:
            return _fail(str(e), EXIT_USAGE, e, verbose)
        home = settings.home
        level = log_level(args.command, settings.logging.level, verbose)
        configure_logging(level, settings.logging.format, settings.secret_values())
        code = int(args.handler(args, settings) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_REFUSED
    except CommandError as e:
        return _fail(str(e), e.code, e, verbose)
    except (ConfigError, StartupError) as e:
        return _fail(str(e), EXIT_USAGE, e, verbose)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the CLI's boundary: environment problems get one line, bugs a traceback
        if any(isinstance(x, BrokenPipeError) for x in _chain(e)):
            _quiet_stdout()
            return EXIT_REFUSED
        message = explain(e, home)
        if message is None:
            raise
        return _fail(message, EXIT_REFUSED, e, verbose)
