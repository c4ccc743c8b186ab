"""``mnemo chat [--user NAME]``: the whole pipeline in a terminal (platform ``cli``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import sys
from collections.abc import AsyncIterator

from mnemo.adapters.console import ConsoleAdapter
from mnemo.cli.terminal import Spinner, progress
from mnemo.gateway.config import TRIAL_BANNER, Settings
from mnemo.gateway.events import ChatRef, OutboundMessage
from mnemo.memory.scope import validate_id

PROGRESS_EVERY = 100  # piped input: a progress line on the terminal every this many turns


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("chat", help="chat with the bot in this terminal (scripted when stdin is not a TTY)")
    p.add_argument("--user", help="your user name (default: the OS user name)")
    p.set_defaults(handler=run)


class LiveConsole(ConsoleAdapter):
    """The console with signs of life on stderr (a terminal only): a spinner while a
    turn runs, and for piped input a progress line every ``PROGRESS_EVERY`` turns."""

    supports_typing = True

    def __init__(self, user: str) -> None:
        super().__init__(user)
        self.turns = 0
        self._spinner: Spinner | None = None

    @contextlib.asynccontextmanager
    async def typing(self, chat: ChatRef) -> AsyncIterator[None]:
        self.turns += 1
        what = "thinking" if self.interactive else f"answering line {self.turns:,}"
        self._spinner = Spinner(what)
        self._spinner.start()
        try:
            yield
        finally:
            self._stop_spinner()
            if not self.interactive:
                progress(self.turns, PROGRESS_EVERY, "lines answered")

    async def send(self, message: OutboundMessage) -> list[str]:
        self._stop_spinner()  # the reply never shares a line with a spinner frame
        return await super().send(message)

    def _stop_spinner(self) -> None:
        spinner, self._spinner = self._spinner, None
        if spinner is not None:
            spinner.stop()


async def _chat(settings: Settings, user: str) -> int:
    from mnemo.app import open_app

    console = LiveConsole(user)
    if settings.trial_mode:  # before the reader's first prompt
        print(f"*** {TRIAL_BANNER}", file=sys.stderr)
    async with open_app(settings, adapters=[console]) as app:
        await console.finished.wait()
        # Scripted input ended: let queued replies go out before shutting down.
        await app.gateway.lanes.drain(30.0)
        await app.gateway.delivery.deliver_due()
    return 1 if console.failed else 0  # a reader that stopped on an error is not a clean run


def run(args: argparse.Namespace, settings: Settings) -> int:
    user = args.user or getpass.getuser() or "operator"
    try:
        validate_id("user", user)
    except ValueError as e:
        from mnemo.cli.main import CommandError

        raise CommandError(f"--user: {e}", code=2) from None
    from mnemo.profile_lock import hold

    with hold(settings.home):  # a running `mnemo run` on this profile: exit 1, not a second gateway
        return asyncio.run(_chat(settings, user))
