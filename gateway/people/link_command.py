"""``/link``: one person across platforms (``links.py``), both accounts acting.

``/link`` in a private chat answers with a one-time code (ten minutes); ``/link CODE``
sent from the other account, in a private chat too, links the two. Codes are never
given in a group: anyone in the room could redeem one and read the profile. A wrong or
expired code links nothing and says so.
"""

from __future__ import annotations

from mnemo.gateway.commands import Command, CommandCall
from mnemo.gateway.people.links import CODE_TTL_S, LinkRepository, Redeemed, normalize_code


class LinkCommand:
    def __init__(self, links: LinkRepository) -> None:
        self.links = links

    async def __call__(self, call: CommandCall) -> str:
        user = call.msg.speaker
        if not call.msg.is_dm:
            return (
                "Send /link in a private chat with me: a code shown here could be used by anyone in the room."
            )
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
        return f"Linked: this account and {others} are now one person to me — one profile, one budget.{note}"


def link_command(links: LinkRepository) -> Command:
    return Command(
        "link",
        "link your accounts on other platforms (/link, then /link CODE there)",
        LinkCommand(links),
        takes_args=True,
    )
