"""``mnemo setup``: set up (or change) a profile, then run ``mnemo doctor`` on it.

On a terminal it is a wizard: the model key (checked with one request), Telegram (the
token checked with ``getMe`` and the bot's name shown; then you send the bot a message
from your own account and it lets you in as admin), Discord (token and the Message
Content intent checked), who else may talk to the bot, a memory provider with its
settings and a reachability check, the database, backups. Enter keeps the value in
brackets, so re-running it edits the profile; nothing is saved until every answer
checked out.

For scripts, the same with flags and no questions::

    mnemo setup --non-interactive --anthropic-key KEY --telegram-token TOKEN \\
        [--allow-user PLATFORM:ID …] [--admin PLATFORM:ID …] \\
        [--provider NAME --set K=V …] [--database-url URL] [--backups on|off] [--json]

Only what is given changes. A failed check (a refused key or token, an unreachable
provider) writes nothing and exits 1. Secrets go to ``.env`` (0600), the rest to
``config.yaml`` (``setup_files.py``: edited in place, never clobbered). The end is the
doctor's report; the exit code is the doctor's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.errors import ConfigError
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.scope import UserRef

if TYPE_CHECKING:  # the checks import aiohttp: only when setup runs, never for --help
    from mnemo.cli.setup_checks import Verdict

PAIR_WAIT_S = 120.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "setup",
        help="set up this profile: model key, Telegram/Discord, who may talk, memory, backups",
        description=(
            "A wizard on a terminal; with --non-interactive, only the flags given change. "
            "Checks every key and token before saving, writes config.yaml and .env (0600), "
            "then runs mnemo doctor."
        ),
    )
    p.add_argument("--non-interactive", action="store_true", help="ask nothing: apply the flags given")
    p.add_argument("--anthropic-key", metavar="KEY", help="the model API key (saved in .env)")
    p.add_argument("--anthropic-base-url", metavar="URL", help="an Anthropic-compatible endpoint")
    p.add_argument("--model", metavar="NAME", help="the model answering chats (llm.model)")
    p.add_argument("--telegram-token", metavar="TOKEN", help="the bot token from @BotFather (saved in .env)")
    p.add_argument("--telegram-api-base-url", metavar="URL", help="a self-hosted Bot API server")
    p.add_argument("--discord-token", metavar="TOKEN", help="the Discord bot token (saved in .env)")
    p.add_argument("--discord-api-base-url", metavar="URL", help="another Discord REST endpoint")
    p.add_argument(
        "--allow-user", action="append", default=[], metavar="PLATFORM:ID", help="who may talk to the bot"
    )
    p.add_argument("--admin", action="append", default=[], metavar="PLATFORM:ID", help="an admin of the bot")
    p.add_argument(
        "--provider", metavar="NAME", help="the memory provider to use ('none': the built-in only)"
    )
    p.add_argument(
        "--set", dest="values", action="append", default=[], metavar="KEY=VALUE", help="a provider setting"
    )
    p.add_argument("--database-url", metavar="URL", help="postgresql://… (saved in .env); default SQLite")
    p.add_argument("--backups", choices=("on", "off"), help="daily verified backups (backup.enabled)")
    p.add_argument("--json", action="store_true", help="print what changed and the doctor's checks as JSON")
    p.set_defaults(handler=setup)


@dataclass
class Plan:
    """What this run will write, gathered (and checked) before anything is."""

    config: dict[str, Any] = field(default_factory=dict)  # dotted key -> value
    env: dict[str, str] = field(default_factory=dict)  # secrets
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)  # shown in --json
    provider: tuple[str, dict[str, Any]] | None = None  # settings to store for it

    def checked(self, what: str, verdict: Verdict) -> None:
        self.checks[what] = {"ok": verdict.ok, "detail": verdict.detail}


def setup(args: argparse.Namespace, settings: Settings) -> int:
    interactive = not args.non_interactive and sys.stdin.isatty()
    if not interactive and not args.non_interactive:
        raise CommandError(
            "stdin is not a terminal: use mnemo setup --non-interactive with flags", EXIT_USAGE
        )
    if interactive:
        from mnemo.cli.setup_wizard import Wizard

        plan = Wizard(settings).run()
    else:
        plan = from_flags(args, settings)
    return finish(settings, plan, as_json=args.json)


def user_list(values: list[str], flag: str) -> list[str]:
    out = []
    for raw in values:
        for part in raw.split(","):
            if not part.strip():
                continue
            try:
                out.append(str(UserRef.parse(part.strip())))
            except InvalidIdentifier as e:
                raise CommandError(
                    f"{flag} {part.strip()!r}: {e} (expected PLATFORM:ID, e.g. telegram:12345)"
                ) from None
    return out


def candidate(settings: Settings, overrides: dict[str, Any]) -> Settings:
    """The profile as it would be with ``overrides`` (for checks before saving)."""
    try:
        return load_settings(settings.home, overrides=overrides)
    except ConfigError as e:
        raise CommandError(str(e), EXIT_USAGE) from None


def from_flags(args: argparse.Namespace, settings: Settings) -> Plan:
    from mnemo.cli import setup_checks

    plan = Plan()
    if args.anthropic_base_url:
        plan.config["llm.base_url"] = args.anthropic_base_url
    if args.model:
        plan.config["llm.model"] = args.model
    if args.anthropic_key or args.anthropic_base_url:
        if args.anthropic_key:
            plan.env["ANTHROPIC_API_KEY"] = args.anthropic_key
        overrides = {"llm.api_key": args.anthropic_key} if args.anthropic_key else {}
        verdict = asyncio.run(setup_checks.model(candidate(settings, {**plan.config, **overrides})))
        _require(plan, "model", verdict)
    if args.telegram_token:
        base = args.telegram_api_base_url or settings.telegram.api_base_url
        _require(plan, "telegram", asyncio.run(setup_checks.telegram(base, args.telegram_token)))
        plan.env["TELEGRAM_BOT_TOKEN"] = args.telegram_token
    if args.telegram_api_base_url:
        plan.config["telegram.api_base_url"] = args.telegram_api_base_url
    if args.discord_token:
        base = args.discord_api_base_url or settings.discord.api_base_url
        _require(plan, "discord", asyncio.run(setup_checks.discord(base, args.discord_token)))
        plan.env["DISCORD_BOT_TOKEN"] = args.discord_token
    if args.discord_api_base_url:
        plan.config["discord.api_base_url"] = args.discord_api_base_url
    allowed = user_list(args.allow_user, "--allow-user")
    admins = user_list(args.admin, "--admin")
    if allowed:
        plan.config["access.allowed"] = _merged(settings.access.allowed, allowed)
    if admins:
        plan.config["access.admins"] = _merged(settings.access.admins, admins)
    if args.values and not args.provider:
        raise CommandError("--set configures a provider: give --provider NAME too", EXIT_USAGE)
    if args.provider:
        from mnemo.cli.setup_provider import plan_provider

        plan_provider(plan, settings, args.provider, args.values)
    if args.database_url:
        plan.env["MNEMO_DATABASE_URL"] = args.database_url
    if args.backups:
        plan.config["backup.enabled"] = args.backups == "on"
    has_model = bool(args.anthropic_key or args.anthropic_base_url) or settings.has_llm_endpoint
    if (args.telegram_token or args.discord_token) and not has_model:
        raise CommandError(
            "a platform token needs a model key: give --anthropic-key too (a public bot never answers "
            "with the scripted trial model)",
            EXIT_USAGE,
        )
    return plan


def _merged(current: tuple[str, ...], new: list[str]) -> list[str]:
    return list(dict.fromkeys([*current, *new]))


def _require(plan: Plan, what: str, verdict: Verdict) -> None:
    plan.checked(what, verdict)
    if not verdict.ok:
        raise CommandError(f"{what}: {verdict.detail} — nothing was saved", EXIT_REFUSED)


def finish(settings: Settings, plan: Plan, *, as_json: bool, out: Callable[[str], None] = print) -> int:
    """Store the provider's settings, write config.yaml and .env, then the doctor."""
    from mnemo.cli import setup_files
    from mnemo.cli.doctor import Status, provider_secrets, render, run_checks, scrub
    from mnemo.cli.terminal import colored

    if plan.provider is not None:
        from mnemo.cli.setup_provider import save_provider

        save_provider(settings, *plan.provider)
    try:
        saved, changes = setup_files.apply(settings.home, plan.config, plan.env)
    except ConfigError as e:
        raise CommandError(f"not saved: {e}", EXIT_USAGE) from None
    checks = asyncio.run(run_checks(saved))
    secrets = saved.secret_values() + provider_secrets(saved)
    failed = [c.name for c in checks if c.status is Status.FAIL]
    if as_json:
        body = {
            "home": str(saved.home),
            "changed": {"config": list(changes.config), "env": list(changes.env)},
            "checks": {k: {**v, "detail": scrub(v["detail"], secrets)} for k, v in plan.checks.items()},
            "doctor": [
                {"name": c.name, "status": c.status.name.lower(), "detail": scrub(c.detail, secrets)}
                for c in checks
            ],
            "ok": not failed,
        }
        out(json.dumps(body, indent=2))
        return EXIT_REFUSED if failed else EXIT_OK
    what = ", ".join([*changes.config, *changes.env]) or "nothing (every value was already set)"
    out(f"saved in {saved.home}: {what}")
    if changes.backup is not None:
        out(f"the previous config.yaml is kept as {changes.backup}")
    out("mnemo doctor:")
    color = colored(sys.stdout)
    for check in checks:
        out("  " + render(check, secrets, color=color))
    if failed:
        out(f"{len(failed)} check(s) failed: {', '.join(failed)} — fix them and run mnemo setup again")
        return EXIT_REFUSED
    out("all checks passed: start the bot with  mnemo run")
    return EXIT_OK
