"""Entry point of the ``mnemo`` command.

Exit codes: 0 success, 1 refused (the action was understood but not allowed or failed),
2 usage or configuration error (with a message naming the problem).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import mnemo.cli as cli_pkg
from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.errors import ConfigError, StartupError
from mnemo.gateway.logs import configure_logging

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A command failed in a way the user should read; carries the exit code."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mnemo", description="Self-hosted chat bot with layered memory.")
    parser.add_argument("--home", metavar="DIR", help="profile folder (default: $MNEMO_HOME or ~/.mnemo)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if info.name == "main":
            continue
        module = importlib.import_module(f"{cli_pkg.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if callable(register):
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings: Settings = load_settings(args.home)
    except ConfigError as e:
        print(f"mnemo: {e}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings.logging.level, settings.logging.format, settings.secret_values())
    try:
        return int(args.handler(args, settings) or 0)
    except CommandError as e:
        print(f"mnemo: {e}", file=sys.stderr)
        return e.code
    except (ConfigError, StartupError) as e:
        print(f"mnemo: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130

