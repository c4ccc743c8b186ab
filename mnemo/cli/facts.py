"""``mnemo facts``: inspect and feed the holographic fact store from a shell.

Every command calls the provider's ``fact_store`` tool with a primary-context call
for ``--user`` (or for the shared facts without it), so scoping, validation and
results are exactly what the model gets. ``--json`` prints the tool's JSON result.
``add`` opens the configured backend too: the write is journaled (actor ``cli``).
Exit codes: 0 success, 1 refused (e.g. the store cannot be opened), 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.discovery import load_provider, provider_config
from mnemo.memory.errors import InvalidIdentifier, ProviderError
from mnemo.memory.journal import DocumentJournal
from mnemo.memory.provider import MemoryProvider, ProviderContext
from mnemo.memory.scope import AgentContext, UserRef

PROVIDER = "holographic"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "facts",
        help="add, search or probe facts in the holographic fact store",
        description="The holographic fact store, through the same code path as the fact_store tool.",
    )
    sub = parser.add_subparsers(dest="facts_command", metavar="ACTION", required=True)

    add = sub.add_parser("add", help="store one fact")
    add.add_argument("text", metavar="TEXT")
    add.add_argument("--category", default="general")
    _scope(add)
    add.set_defaults(handler=_run, fact_action="add")

    search = sub.add_parser("search", help="natural-language search")
    search.add_argument("text", metavar="QUERY")
    search.add_argument("--limit", type=int, default=10)
    _scope(search)
    search.set_defaults(handler=_run, fact_action="search")

    probe = sub.add_parser("probe", help="every fact about one entity")
    probe.add_argument("text", metavar="ENTITY")
    probe.add_argument("--limit", type=int, default=20)
    _scope(probe)
    probe.set_defaults(handler=_run, fact_action="probe")


def _scope(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--user", metavar="PLATFORM:ID", help="act as this chat user (default: only the shared facts)"
    )
    parser.add_argument("--json", action="store_true", help="print the tool's JSON result")


def _open(settings: Settings, journal: DocumentJournal | None = None) -> MemoryProvider:
    try:
        provider = load_provider(PROVIDER, settings.home)
        config = dict(provider_config(settings.home, provider))
    except ProviderError as e:
        raise CommandError(str(e), EXIT_REFUSED) from None
    if settings.database.url is not None:  # the facts are in the bot's PostgreSQL database
        config["database_url"] = settings.database.url.get_secret_value()
    availability = provider.is_available(settings.home, config)
    if not availability.ok:
        raise CommandError(f"{PROVIDER} is unavailable: {availability.reason}", EXIT_REFUSED)
    provider.use_journal(journal)
    try:
        provider.initialize(settings.home, config)
    except ProviderError as e:
        raise CommandError(str(e), EXIT_REFUSED) from None
    return provider


def _tool_args(args: argparse.Namespace) -> dict[str, Any]:
    match args.fact_action:
        case "add":
            return {"action": "add", "content": args.text, "category": args.category}
        case "search":
            return {"action": "search", "query": args.text, "limit": args.limit}
        case _:
            return {"action": "probe", "entity": args.text, "limit": args.limit}


def _run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        user = UserRef.parse(args.user) if args.user else None
    except InvalidIdentifier as e:
        raise CommandError(f"--user: {e}", EXIT_USAGE) from None
    ctx = ProviderContext(
        session_id="cli",
        chat_key="cli",
        platform=user.platform if user else "cli",
        user=user,
        agent_context=AgentContext.PRIMARY,
        home=settings.home,
        actor="cli",
    )
    if args.fact_action == "add":
        result = asyncio.run(_journaled(settings, args, ctx))
    else:
        provider = _open(settings)
        try:
            result = json.loads(provider.handle_tool_call("fact_store", _tool_args(args), ctx))
        finally:
            provider.shutdown()
    if args.json:
        from mnemo.adapters.terminal import printable_json

        print(printable_json(json.dumps(result, ensure_ascii=False, indent=2)))
    else:
        _print_human(args.fact_action, result)
    return EXIT_OK if result.get("ok") else EXIT_REFUSED


async def _journaled(settings: Settings, args: argparse.Namespace, ctx: ProviderContext) -> dict[str, Any]:
    """A write, with the backend's journal bound to the provider."""
    from mnemo.gateway.storage import open_backend

    backend = await open_backend(settings)
    try:
        provider = await asyncio.to_thread(_open, settings, backend.documents)
        try:
            text = await asyncio.to_thread(provider.handle_tool_call, "fact_store", _tool_args(args), ctx)
        finally:
            await asyncio.to_thread(provider.shutdown)
    finally:
        await backend.close()
    result: dict[str, Any] = json.loads(text)
    return result


def _print_human(action: str, result: dict[str, Any]) -> None:
    from mnemo.adapters.terminal import printable

    if not result.get("ok"):
        print(printable(f"error: {result.get('error')}"))
        return
    if action == "add":
        entities = ", ".join(result["entities"]) or "none"
        state = "already stored as" if result["duplicate"] else "stored"
        print(printable(f"{state} fact #{result['fact_id']} (entities: {entities})"))
        return
    facts = result["results"] if action == "search" else result["facts"]
    if not facts:
        print("no facts found")
    for f in facts:
        scope = "shared" if f["owner"] == "shared" else "user"
        print(
            printable(
                f"#{f['fact_id']:<6} trust {f['trust']:.2f}  [{f['category']}, {scope}]  {f['content']}"
            )
        )
