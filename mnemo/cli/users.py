"""``mnemo users``: the people mnemo knows, what they spend, their caps, erasure.

    mnemo users list [--json]
    mnemo users show PLATFORM:ID [--json]
    mnemo users usage [--json]                 everyone, highest spend this month first
    mnemo users budget PLATFORM:ID [--daily-usd X] [--monthly-usd X] [--daily-tokens N] [--clear] [--json]
    mnemo users erase PLATFORM:ID [--yes] [--dry-run] [--json]
    mnemo users link PLATFORM:ID PLATFORM:ID [--json]   one person (the first one's profile is kept)
    mnemo users unlink PLATFORM:ID [--json]             split off; it keeps a copy of the profile
    mnemo users policy PLATFORM:ID [--remember on|off|ask] [--groups private|shared] [--json]

Every action works on the configured backend (``open_backend``), through its
repositories — the same reads as the dashboard: the SQLite ``state.db`` and memory
files, or with ``database.url`` the PostgreSQL server that every replica shares
(sessions, spend, caps, links, USER.md rows). ``erase`` prints a receipt per layer on
either; a layer the backend cannot erase (the backup archives on PostgreSQL, for now)
is listed as not erased, with the reason. Exit codes: 0 done, 1 refused (nothing to
show, erase not confirmed), 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.scope import UserRef

if TYPE_CHECKING:
    from mnemo.gateway.people.links import LinkRepository
    from mnemo.gateway.storage import StorageBackend


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("users", help="people: list, usage and budgets, erasure")
    actions = p.add_subparsers(dest="users_action", metavar="ACTION", required=True)
    ls = actions.add_parser("list", help="everyone with a session, a profile or spend")
    show = actions.add_parser("show", help="one person: sessions, profile, spend and caps")
    show.add_argument("user", metavar="PLATFORM:ID")
    usage = actions.add_parser("usage", help="spend today and this month, highest first")
    budget = actions.add_parser(
        "budget", help="show or set a person's own caps (unset = the configured default)"
    )
    budget.add_argument("user", metavar="PLATFORM:ID")
    budget.add_argument("--daily-usd", type=float, metavar="USD")
    budget.add_argument("--monthly-usd", type=float, metavar="USD")
    budget.add_argument("--daily-tokens", type=int, metavar="N")
    budget.add_argument("--clear", action="store_true", help="drop the person's own caps")
    erase = actions.add_parser("erase", help="forget a person in every layer (prints a receipt)")
    erase.add_argument("user", metavar="PLATFORM:ID")
    erase.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    erase.add_argument("--dry-run", action="store_true", help="print the receipt, delete nothing")
    link = actions.add_parser(
        "link", help="link two accounts of one person (shared profile, budget, provider scope)"
    )
    link.add_argument("user", metavar="PLATFORM:ID")
    link.add_argument("other", metavar="PLATFORM:ID")
    unlink = actions.add_parser(
        "unlink", help="split an account off its linked person (it keeps a copy of the profile)"
    )
    unlink.add_argument("user", metavar="PLATFORM:ID")
    policy = actions.add_parser(
        "policy", help="show or set what may be remembered about a person (memory policy)"
    )
    policy.add_argument("user", metavar="PLATFORM:ID")
    policy.add_argument(
        "--remember", choices=("on", "off", "ask"), help="store memories: on, off, or ask them each time"
    )
    policy.add_argument(
        "--groups", choices=("private", "shared"), help="whether their profile may reach group prompts"
    )
    for a in (ls, show, usage, budget, erase, link, unlink, policy):
        a.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_run(args, settings))


def _user(text: str) -> UserRef:
    try:
        return UserRef.parse(text)
    except InvalidIdentifier as e:
        raise CommandError(f"{text!r}: {e}", EXIT_USAGE) from None


def _out(args: argparse.Namespace, data: Any, lines: list[str]) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2) if args.json else "\n".join(lines))


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.gateway.storage import open_backend

    backend = await open_backend(settings)  # state.db, or database.url's PostgreSQL (one line if unreachable)
    try:
        return await _act(args, settings, backend)
    finally:
        await backend.close()


async def _act(args: argparse.Namespace, settings: Settings, backend: StorageBackend) -> int:
    from mnemo.gateway.budgets.gate import BudgetGate
    from mnemo.gateway.inbound.access import AccessControl

    ledger = backend.budgets
    gate = BudgetGate(settings.budgets, ledger)
    access = AccessControl(settings, backend.pairings)
    action = args.users_action
    if action == "usage":
        rows = []
        for p in await ledger.everyone():
            # Upkeep (background memory work) is part of the spend, shown apart.
            upkeep = await ledger.upkeep_spend(p.payer)
            rows.append(
                {
                    "user": p.payer,
                    **asdict(p.spend),
                    "upkeep_day_usd": upkeep.day_usd,
                    "upkeep_day_tokens": upkeep.day_tokens,
                    "upkeep_month_usd": upkeep.month_usd,
                }
            )
        _out(
            args,
            rows,
            [
                f"{r['user']}  today ${r['day_usd']:.4f} ({r['day_tokens']:,} tokens; upkeep "
                f"${r['upkeep_day_usd']:.4f}, {r['upkeep_day_tokens']:,} tokens)  month ${r['month_usd']:.4f}"
                f" (upkeep ${r['upkeep_month_usd']:.4f})"
                for r in rows
            ]
            or ["no spend this month"],
        )
        return EXIT_OK
    if action == "list":
        people = await backend.directory.everyone()
        _out(args, people, people or ["nobody yet"])
        return EXIT_OK
    if action == "erase":
        return await _erase(args, settings, backend)
    if action in ("link", "unlink"):
        return await _link(args, backend.links)
    if action == "policy":
        return await _policy(args, settings, backend)
    user = _user(args.user)
    admin = access.is_admin(user.platform, user.user_id)
    if action == "budget":
        from mnemo.gateway.budgets.ledger import Override

        values = (args.daily_usd, args.monthly_usd, args.daily_tokens)
        if any(v is not None and v < 0 for v in values):
            raise CommandError("caps must be zero or more", EXIT_USAGE)
        if args.clear:
            await ledger.set_override(str(user), None)
        elif any(v is not None for v in values):
            old = await ledger.override(str(user)) or Override()
            await ledger.set_override(
                str(user),
                Override(
                    args.daily_usd if args.daily_usd is not None else old.daily_usd,
                    args.monthly_usd if args.monthly_usd is not None else old.monthly_usd,
                    args.daily_tokens if args.daily_tokens is not None else old.daily_tokens,
                ),
            )
    limits = await gate.limits(user, admin=admin)
    spend = await ledger.spend(str(user))
    data: dict[str, Any] = {
        "user": str(user),
        "admin": admin,
        "limits": asdict(limits),
        "own_limits": asdict(o) if (o := await ledger.override(str(user))) else None,
        "spend": asdict(spend),
    }
    lines = [
        f"{user}{' (admin, exempt from the per-user caps)' if limits.exempt else ''}",
        f"caps: daily {_usd(limits.daily_usd)}, monthly {_usd(limits.monthly_usd)}, "
        f"daily tokens {_cap(limits.daily_tokens)}" + (" (own)" if data["own_limits"] else " (default)"),
        f"spend: today ${spend.day_usd:.4f} ({spend.day_tokens:,} tokens), month ${spend.month_usd:.4f}",
    ]
    if action == "show":
        facts = await backend.directory.facts(user)
        data.update(asdict(facts))
        linked = await backend.links.rows(user)
        data["linked"] = [
            {
                "user": str(r.member),
                "canonical": r.member == r.canonical,
                "linked_at": r.linked_at.isoformat(),
                "linked_by": r.linked_by,
            }
            for r in linked
        ]
        # Linked accounts share the canonical account's profile.
        owner = linked[0].canonical if linked else user
        profile = await backend.directory.has_profile(owner)
        lines.append(
            f"sessions: {facts.sessions}, messages written: {facts.messages}, "
            f"profile: {'yes' if profile else 'no'}" + (f" (kept under {owner})" if owner != user else "")
        )
        if linked:
            lines.append(
                "linked: "
                + ", ".join(f"{r.member}{' (profile)' if r.member == r.canonical else ''}" for r in linked)
            )
        if not facts.sessions and not spend.month_usd and not profile and not linked:
            _out(args, data, [*lines, "(mnemo knows nothing of this person)"])
            return EXIT_REFUSED
    _out(args, data, lines)
    return EXIT_OK


async def _erase(args: argparse.Namespace, settings: Settings, backend: StorageBackend) -> int:
    from mnemo.backups import scrubber
    from mnemo.gateway.people.erasure import Erasure

    user = _user(args.user)
    erasure = Erasure(backend.personal_data, settings, scrub=scrubber(settings))
    receipt = await erasure.count(user)
    if not args.dry_run and not args.yes:
        if not sys.stdin.isatty():
            raise CommandError("erase needs --yes when not run interactively (or --dry-run)", EXIT_REFUSED)
        answer = input(f"Erase everything of {user}? This cannot be undone. Type 'erase' to confirm: ")
        if answer.strip() != "erase":
            print("not erased")
            return EXIT_REFUSED
    if not args.dry_run:
        receipt = await erasure.erase(user)
    _out(
        args,
        {
            "user": str(user),
            "dry_run": args.dry_run,
            "removed": receipt.counts,
            "not_erased": receipt.not_erased,
        },
        [f"{'would remove' if args.dry_run else 'removed'} for {user}:", *receipt.lines()],
    )
    return EXIT_OK


async def _link(args: argparse.Namespace, links: LinkRepository) -> int:
    user = _user(args.user)
    if args.users_action == "unlink":
        done = await links.unlink(user)
        if not done.was_linked:
            _out(args, {"user": str(user), "unlinked": False}, [f"{user} is not linked"])
            return EXIT_REFUSED
        _out(
            args,
            {"user": str(user), "unlinked": True, "remaining": [str(m) for m in done.remaining]},
            [
                f"unlinked {user}: it keeps a copy of the profile; {', '.join(map(str, done.remaining))} stay linked"
                if len(done.remaining) > 1
                else f"unlinked {user} from {done.remaining[0]}: each keeps a copy of the profile"
            ],
        )
        return EXIT_OK
    other = _user(args.other)
    if other == user:
        raise CommandError(f"{user} cannot be linked with itself", EXIT_USAGE)
    result = await links.link(user, other)
    data: dict[str, Any] = {
        "user": str(user),
        "other": str(other),
        "linked": result.status.value == "linked",
        "already": result.status.value == "already",
        "canonical": str(result.canonical),
        "members": [str(m) for m in result.members],
        "merged": result.merged,
        "left_out": result.left_out,
    }
    if data["already"]:
        _out(args, data, [f"{user} and {other} are already linked"])
        return EXIT_OK
    lines = [
        f"linked {', '.join(data['members'])}: one profile ({result.canonical}), budget and provider scope",
        f"profile entries merged: {result.merged}"
        + (f", left out: {result.left_out}" if result.left_out else ""),
    ]
    _out(args, data, lines)
    return EXIT_OK


async def _policy(args: argparse.Namespace, settings: Settings, backend: StorageBackend) -> int:
    from mnemo.gateway.turns.policy import defaults_of
    from mnemo.memory.policy import ChatPolicy, Groups, Remember, effective

    user = _user(args.user)
    person = str(backend.identities.canonical(user))  # linked accounts share one policy
    repo = backend.policies
    if args.remember is not None or args.groups is not None:
        remember = Remember(args.remember) if args.remember is not None else None
        groups = Groups(args.groups) if args.groups is not None else None
        await repo.set_person(person, remember=remember, groups=groups, by="cli")
    own = await repo.person(person)
    holds = effective(defaults_of(settings.memory.policy), own, ChatPolicy(), is_group=True)
    data = {
        "user": str(user),
        "person": person,
        "remember": str(holds.person_remember),
        "groups": str(holds.groups),
        "set": {"remember": own.remember, "groups": own.groups},
    }
    default = " (default)"
    _out(
        args,
        data,
        [
            f"{user}" + (f" (policy kept under {person})" if person != str(user) else ""),
            f"remember: {holds.person_remember}{'' if own.remember else default}",
            f"groups: {holds.groups}{'' if own.groups else default}",
        ],
    )
    return EXIT_OK


def _cap(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def _usd(value: float | None) -> str:
    return "none" if value is None else f"${value:g}"
