"""``/forget me``: a person erases themselves (``erasure.py``), confirmed with a code.

``/forget me`` answers with a one-time code valid for ten minutes; ``/forget me CODE``
from the same account erases and answers with the receipt. Codes live in memory: a
restart simply asks for a new one.

The erasure takes the confirming message's own inbox row with the rest, and the
receipt goes straight to the platform (``Unrecorded``): no outbox row, so afterwards no
row names the person — not even the confirmation's.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from mnemo.gateway.commands import CommandCall, Unrecorded
from mnemo.gateway.people.erasure import Erasure

CODE_TTL_S = 600
# Erasure removes the person's pairing too: without a word they would simply get no
# more answers.
PAIRING_WARNING = (
    "Your pairing with this bot is erased with it: I will not answer you again until the bot's admin "
    "lets you in again."
)
PAIRING_ERASED = (
    "Your pairing with this bot was erased too, so I will not answer your messages any more; "
    "to talk to me again, ask the bot's admin to let you in."
)


class ForgetMe:
    def __init__(self, erasure: Erasure, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.erasure = erasure
        self.clock = clock
        self._codes: dict[str, tuple[str, float]] = {}

    async def __call__(self, call: CommandCall) -> str | Unrecorded:
        user = call.msg.speaker
        words = call.args.split()[1:]  # after "me"
        now = self.clock()
        if not words:
            code = secrets.token_hex(4).upper()
            self._codes[str(user)] = (code, now + CODE_TTL_S)
            receipt = await self.erasure.count(user)
            linked = [str(a) for a in await self.erasure.accounts(user) if a != user]
            also = f", on this account and your linked accounts ({', '.join(linked)})" if linked else ""
            access = f" {PAIRING_WARNING}" if receipt.counts.get("pairing") else ""
            return (
                "This will erase everything I have of you: your profile, your conversations with me, "
                f"what you wrote in group chats, your facts and usage ({receipt.total} items{also}).{access} "
                f"It cannot be undone. To confirm, send within 10 minutes: /forget me {code}"
            )
        pending = self._codes.get(str(user))
        if pending is None or pending[1] < now or not secrets.compare_digest(words[0].upper(), pending[0]):
            return "That code is wrong or has expired: send /forget me for a new one."
        del self._codes[str(user)]
        receipt = await self.erasure.erase(user)
        text = "Erased everything I had of you:\n" + "\n".join(receipt.lines())
        if receipt.counts.get("pairing"):
            text += f"\n{PAIRING_ERASED}"
        return Unrecorded(text)
