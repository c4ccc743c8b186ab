"""``mnemo providers``: list the memory providers and configure one.

``list`` shows every provider found (installed entry points and folders under
``$MNEMO_HOME/providers/``), whether it can run here or why not, and which one
``memory.provider`` selects.

``setup NAME`` asks for the provider's settings, driven by its config schema: each
field is prompted on a terminal (the current or default value in brackets, secrets
without echo), or given as ``--set key=value`` (repeatable; no prompts then for the
keys given, and none at all when stdin is not a terminal). Settings are stored in
``$MNEMO_HOME/providers/NAME/config.json`` — secret fields in ``secrets.json`` (mode
0600, never exported) — because ``config.yaml`` has no per-provider section. Then the
provider is activated (``memory.provider`` in config.yaml, edited in place): with
``--activate``, or on a terminal when you say yes.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable, Mapping
from typing import Any

from mnemo.cli import provider_status
from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.discovery import discover, load_provider
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider_config import ConfigField, ConfigKind, read_provider_config


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "providers",
        help="list memory providers or configure one",
        description="Memory providers (layer 4): list what is installed, configure one.",
    )
    sub = parser.add_subparsers(dest="providers_command", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="name, description, and whether each provider can run here")
    ls.add_argument(
        "--json", action="store_true", help="machine-readable: installed, configured, available per provider"
    )
    ls.set_defaults(handler=_list)
    st = sub.add_parser("status", help="the active provider: reachable, last error, queued/failed writes")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(handler=provider_status.status)
    setup = sub.add_parser("setup", help="configure one provider from its settings schema")
    setup.add_argument("name", metavar="NAME")
    setup.add_argument(
        "--set",
        dest="values",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set one field (repeatable)",
    )
    setup.add_argument(
        "--activate",
        action="store_true",
        help="also make it the active provider (memory.provider in config.yaml); on a terminal you are asked",
    )
    setup.set_defaults(handler=_setup)


def _list(args: argparse.Namespace, settings: Settings) -> int:
    if args.json:
        return provider_status.list_json(settings)
    infos = discover(settings.home)
    if not infos:
        print("no memory providers installed")
        return EXIT_OK
    active = settings.memory.provider
    width = max(len(i.name) for i in infos)
    for info in infos:
        mark = "*" if info.name == active else " "
        state = "available" if info.available else f"unavailable: {info.reason}"
        print(f"{mark} {info.name:<{width}}  {state}")
        if info.description:
            print(f"  {'':<{width}}  {info.description}")
    if active is None:
        print("\nno provider is active (set memory.provider in config.yaml)")
    elif active not in {i.name for i in infos}:
        print(f"\nmemory.provider names {active!r}, which is not installed")
        return EXIT_REFUSED
    return EXIT_OK


def _parse_sets(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--set expects KEY=VALUE, got {pair!r}", EXIT_USAGE)
        out[key.strip()] = value
    return out


def _shown(field: ConfigField, value: Any) -> str:
    if value is None:
        return ""
    if field.secret:
        return "********"
    if field.kind is ConfigKind.BOOLEAN:
        return "yes" if value else "no"
    return str(value)


def prompt_fields(
    fields: tuple[ConfigField, ...],
    current: Mapping[str, Any],
    ask: Callable[[str], str] = input,
    ask_secret: Callable[[str], str] = getpass.getpass,
) -> dict[str, Any]:
    """Ask for each field until its answer parses; Enter keeps the bracketed value."""
    out: dict[str, Any] = {}
    for field in fields:
        print(
            f"{field.key}: {field.description}" + (f" ({', '.join(field.choices)})" if field.choices else "")
        )
        existing = current.get(field.key, field.default)
        while True:
            label = f"  {field.key} [{_shown(field, existing)}]: "
            answer = (ask_secret if field.secret else ask)(label).strip()
            if not answer:
                if existing is None and field.required:
                    print("  a value is required")
                    continue
                if existing is not None:
                    out[field.key] = existing
                break
            try:
                out[field.key] = field.parse(answer)
                break
            except ProviderError as e:
                print(f"  {e}")
    return out


def _setup(args: argparse.Namespace, settings: Settings) -> int:
    try:
        provider = load_provider(args.name, settings.home)
    except ProviderError as e:
        raise CommandError(str(e), EXIT_USAGE) from None
    schema = tuple(provider.get_config_schema())
    given = _parse_sets(args.values)
    known = {f.key for f in schema}
    unknown = sorted(set(given) - known)
    if unknown:
        raise CommandError(
            f"{args.name}: unknown setting(s) {', '.join(unknown)} (allowed: {', '.join(sorted(known)) or 'none'})",
            EXIT_USAGE,
        )
    try:
        current = read_provider_config(settings.home, args.name)
        values: dict[str, Any] = {k: v for k, v in current.items() if k in known}
        values.update(given)
        if not schema:
            print(f"{args.name} has no settings")
        elif sys.stdin.isatty():
            remaining = tuple(f for f in schema if f.key not in given)
            values.update(prompt_fields(remaining, current))
        path = provider.save_config(values, settings.home)
        config = read_provider_config(settings.home, args.name, schema)
    except ProviderError as e:
        raise CommandError(str(e), EXIT_USAGE) from None
    print(f"saved {path}")
    availability = provider.is_available(settings.home, config)
    if not availability.ok:
        print(f"{args.name} is not available yet: {availability.reason}")
        return EXIT_REFUSED
    if settings.memory.provider != args.name:
        return _activate(args, settings)
    return EXIT_OK


def _activate(args: argparse.Namespace, settings: Settings) -> int:
    """Make ``args.name`` the active provider: with ``--activate``, or when the person at
    the terminal says yes; otherwise say how."""
    if not args.activate:
        if not sys.stdin.isatty():
            print(
                f"to use it: mnemo providers setup {args.name} --activate (sets memory.provider in config.yaml)"
            )
            return EXIT_OK
        answer = input(f"activate {args.name} now (memory.provider in {settings.config_path})? [Y/n]: ")
        if answer.strip().lower() not in ("", "y", "yes"):
            print(f"not activated; later: mnemo providers setup {args.name} --activate")
            return EXIT_OK
    from mnemo.cli.setup_files import apply
    from mnemo.gateway.errors import ConfigError

    try:
        apply(settings.home, {"memory.provider": args.name}, {})
    except ConfigError as e:
        raise CommandError(f"not activated: {e}", EXIT_USAGE) from None
    print(f"{args.name} is now the active memory provider (restart mnemo run to use it)")
    return EXIT_OK
