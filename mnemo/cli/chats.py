"""``mnemo chats``: per-chat settings kept in the store.

    mnemo chats policy PLATFORM:CHAT_ID [--remember on|off] [--history on|off] [--json]

A chat's memory policy (``memory/policy.py``): ``--remember off`` makes it an ephemeral
chat (nothing said there reaches any memory layer: no curated writes, no facts, no
provider sync, no skill writes or review); ``--history off`` keeps no messages between
its turns. Unset values follow ``memory.policy.*``. ``CHAT_ID`` is the platform's chat
id (a Telegram group: ``telegram:-1001234567890``). Works on the configured backend.
Exit codes: 0 done, 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING, Any

from mnemo.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.scope import validate_id

if TYPE_CHECKING:
    from mnemo.gateway.storage import StorageBackend


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("chats", help="per-chat settings: the memory policy")
    actions = p.add_subparsers(dest="chats_action", metavar="ACTION", required=True)
    policy = actions.add_parser("policy", help="show or set what may be remembered from a chat")
    policy.add_argument("chat", metavar="PLATFORM:CHAT_ID")
    policy.add_argument("--remember", choices=("on", "off"), help="off: nothing said there is remembered")
    policy.add_argument("--history", choices=("on", "off"), help="off: no messages kept between turns")
    policy.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def _chat(text: str) -> tuple[str, str]:
    platform, sep, chat_id = text.partition(":")
    try:
        if not sep:
            raise InvalidIdentifier(f"expected PLATFORM:CHAT_ID, got {text!r}")
        validate_id("platform", platform)
        validate_id("chat", chat_id)
    except InvalidIdentifier as e:
        raise CommandError(f"{text!r}: {e}", EXIT_USAGE) from None
    return platform, chat_id


def run(args: argparse.Namespace, settings: Settings) -> int:
    platform, chat_id = _chat(args.chat)
    return asyncio.run(_run(args, settings, platform, chat_id))


async def _run(args: argparse.Namespace, settings: Settings, platform: str, chat_id: str) -> int:
    from mnemo.gateway.storage import open_backend

    backend = await open_backend(settings)
    try:
        return await _policy(args, settings, backend, platform, chat_id)
    finally:
        await backend.close()


async def _policy(
    args: argparse.Namespace, settings: Settings, backend: StorageBackend, platform: str, chat_id: str
) -> int:
    from mnemo.gateway.turns.policy import defaults_of
    from mnemo.memory.policy import History, PersonPolicy, Remember, chat_ref, effective

    chat = chat_ref(platform, chat_id)
    repo = backend.policies
    if args.remember is not None or args.history is not None:
        await repo.set_chat(
            chat,
            remember=Remember(args.remember) if args.remember is not None else None,
            history=History(args.history) if args.history is not None else None,
            by="cli",
        )
    own = await repo.chat(chat)
    # A chat id alone does not say whether it is a group: the group default is shown
    # for a chat nobody set (every chat but a DM follows it).
    holds = effective(defaults_of(settings.memory.policy), PersonPolicy(), own, is_group=True)
    data: dict[str, Any] = {
        "chat": chat,
        "remember": str(holds.chat_remember),
        "history": str(holds.history),
        "set": {"remember": own.remember, "history": own.history},
    }
    if args.json:
        print(json.dumps(data, ensure_ascii=False, indent=2))
    else:
        default = " (default)"
        print(chat)
        print(f"remember: {holds.chat_remember}{'' if own.remember else default}")
        print(f"history: {holds.history}{'' if own.history else default}")
    return EXIT_OK
