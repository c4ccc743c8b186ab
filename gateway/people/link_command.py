"""``/link``: one person across platforms (``links.py``), both accounts acting.

``/link`` in a private chat answers with a one-time code (ten minutes); ``/link CODE``
sent from the other account, in a private chat too, links the two. Codes are never
given in a group: anyone in the room could redeem one and read the profile. A wrong or
expired code links nothing and says so.

A code can leak. So when one is redeemed, every other account of the person gets a
notice in its private chat, through the durable outbox ("telegram:… was linked to
your profile"), and ``/link undo`` from any of them within 24 hours takes the newest
link back (``LinkRepository.undo_latest``) — the split-off account keeps no copy of
the profile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from mnemo.gateway.commands import Command, CommandCall
from mnemo.gateway.delivery.outbox import OutboxQueue
from mnemo.gateway.events import ChatRef, OutboundMessage
from mnemo.gateway.people.links import CODE_TTL_S, UNDO_WINDOW_S, LinkRepository, Redeemed, normalize_code
from mnemo.memory.scope import UserRef

UNDO_HOURS = UNDO_WINDOW_S // 3600


class AccountNotices(Protocol):
    """A notice to one account's private chat (``OutboxNotices``)."""

    async def notify(self, user: UserRef, text: str) -> None: ...


class OutboxNotices:
    """``AccountNotices`` through the durable outbox: sent after a crash too; an
    account's private chat is addressed by its id, as the admins' notices are."""

    def __init__(self, outbox: OutboxQueue, wake: Callable[[], None]) -> None:
        self.outbox = outbox
        self.wake = wake

    async def notify(self, user: UserRef, text: str) -> None:
        await self.outbox.enqueue(OutboundMessage(ChatRef(user.platform, user.user_id), text), kind="notice")
        self.wake()


class LinkCommand:
    def __init__(self, links: LinkRepository, notices: AccountNotices) -> None:
        self.links = links
        self.notices = notices

    async def __call__(self, call: CommandCall) -> str:
        user = call.msg.speaker
        if not call.msg.is_dm:
            return (
                "Send /link in a private chat with me: a code shown here could be used by anyone in the room."
            )
        if call.args.strip().lower() == "undo":
            return await self._undo(user)
        code = normalize_code(call.args)
        if not code:
            issued = await self.links.issue_code(user)
            members = [m for m in await self.links.members(user) if m != user]
            now = f" This account is linked with {', '.join(map(str, members))}." if members else ""
            return (
                f"To link this account with yours on another platform, send this to me there, in a private "
                f"chat, within {CODE_TTL_S // 60} minutes: /link {issued}\n"
                "Linked accounts share your profile, your budget and what I remember of you; each chat "
                f"keeps its own history.{now}"
            )
        result = await self.links.redeem(code, user)
        if result.status is Redeemed.WRONG or result.status is Redeemed.EXPIRED:
            return (
                "That code is wrong or has expired, so nothing was linked: send /link on your"
                " other account for a new one."
            )
        if result.status is Redeemed.OWN:
            return "That code is for this account: send /link CODE from your other account."
        others = ", ".join(str(m) for m in result.members if m != user)
        if result.status is Redeemed.ALREADY:
            return f"This account is already linked with {others}."
        note = (
            f" {result.left_out} entr{'y' if result.left_out == 1 else 'ies'} of the profiles did"
            " not fit and were left out."
            if result.left_out
            else ""
        )
        # Whoever asked for the code is told, and so is every other account of the person.
        for member in result.members:
            if member != user:
                await self.notices.notify(
                    member,
                    f"{user} was linked to your profile; /link undo within {UNDO_HOURS} h if that was not you "
                    "(it then no longer shares your profile, budget or memories).",
                )
        return f"Linked: this account and {others} are now one person to me — one profile, one budget.{note}"

    async def _undo(self, user: UserRef) -> str:
        result = await self.links.undo_latest(user)
        if result.too_late:
            assert result.linked_at is not None
            return (
                f"The newest link was made {result.linked_at:%Y-%m-%d %H:%M} UTC, more than {UNDO_HOURS} h ago, "
                "so /link undo no longer applies: the bot's admin can split accounts (mnemo users unlink)."
            )
        if not result.undone:
            return "There is no link to undo: this account is not linked with another."
        undone = ", ".join(map(str, result.undone))
        return (
            f"Undone: {undone} no longer shares your profile, budget or memories, and keeps no copy of them. "
            "What its own profile added to yours when the link was made stays in yours (see /memory)."
        )


def link_command(links: LinkRepository, notices: AccountNotices) -> Command:
    return Command(
        "link",
        "link your accounts on other platforms (/link, then /link CODE there; /link undo within 24 h)",
        LinkCommand(links, notices),
        takes_args=True,
    )
