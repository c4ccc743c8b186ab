"""``mnemo chat [--user NAME]``: the whole pipeline in a terminal (platform ``cli``)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys

from mnemo.app import open_app
from mnemo.gateway.config import TRIAL_BANNER, Settings
from mnemo.memory.scope import validate_id


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with the bot in this terminal (scripted when stdin is not a TTY)")
    p.add_argument("--user", help="your user name (default: the OS user name)")
    p.set_defaults(handler=run)


async def _chat(settings: Settings, user: str) -> int:
    from mnemo.adapters.console import ConsoleAdapter

    console = ConsoleAdapter(user)
    async with open_app(settings, adapters=[console]) as app:
        if app.trial:
            print(f"*** {TRIAL_BANNER}", file=sys.stderr)
        await console.finished.wait()
        # Scripted input ended: let queued replies go out before shutting down.
        await app.gateway.lanes.drain(30.0)
        await app.gateway.delivery.deliver_due()
    return 0


def run(args: argparse.Namespace, settings: Settings) -> int:
    user = args.user or getpass.getuser() or "operator"
    try:
        validate_id("user", user)
    except ValueError as e:
        from mnemo.cli.main import CommandError

        raise CommandError(f"--user: {e}", code=2) from None
    return asyncio.run(_chat(settings, user))
