"""The fake Discord's world: users, guilds, channels, stored messages, and the JSON shapes
Discord gives them on the wire (API v10).

Kept apart from the HTTP/websocket plumbing (``discord_api.py``, ``discord_gateway.py``)
so the payload shapes can be read in one place and checked against Discord's docs.
Payloads carry the fields discord.py 2.7 reads *and* the ones real Discord sends that an
adapter may rely on (``member`` on guild messages and mentions, ``referenced_message``,
snowflake ids whose timestamps are real), so code written against the fake does not meet
surprises on the real service.

Ids are real snowflakes (milliseconds since the Discord epoch shifted left by 22 bits), so
``message.created_at`` is meaningful. A thread started from a message gets that message's
id, as on Discord.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DISCORD_EPOCH_MS = 1_420_070_400_000

# Permission bits (Discord's "permissions" bitfield) the bot needs for mnemo: view, send,
# read history, reply in and create public threads, embed links, attach files, add
# reactions, use application commands. 311385246784 — the same figure goes in the README.
BOT_PERMISSIONS = (
    (1 << 6) | (1 << 10) | (1 << 11) | (1 << 14) | (1 << 15) | (1 << 16) | (1 << 31) | (1 << 35) | (1 << 38)
)

# Gateway intents (bit values from Discord's docs).
INTENT_GUILDS = 1 << 0
INTENT_GUILD_MEMBERS = 1 << 1  # privileged
INTENT_GUILD_PRESENCES = 1 << 8  # privileged
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_DIRECT_MESSAGES = 1 << 12
INTENT_MESSAGE_CONTENT = 1 << 15  # privileged
PRIVILEGED_INTENTS = {
    "members": INTENT_GUILD_MEMBERS,
    "presences": INTENT_GUILD_PRESENCES,
    "message_content": INTENT_MESSAGE_CONTENT,
}
# Application flags advertising privileged intents toggled on in the developer portal, in
# their "limited" form (an unverified bot in fewer than 100 servers).
_APP_FLAG_FOR_INTENT = {"presences": 1 << 13, "members": 1 << 15, "message_content": 1 << 19}

_USER_MENTION = re.compile(r"<@!?(\d+)>")
_ROLE_MENTION = re.compile(r"<@&(\d+)>")


class ChannelType(enum.IntEnum):
    GUILD_TEXT = 0
    DM = 1
    PUBLIC_THREAD = 11
    PRIVATE_THREAD = 12


class MessageType(enum.IntEnum):
    DEFAULT = 0
    REPLY = 19


def snowflake_time(snowflake: int) -> dt.datetime:
    ms = (snowflake >> 22) + DISCORD_EPOCH_MS
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def iso(when: dt.datetime) -> str:
    return when.isoformat()


class Snowflakes:
    """Monotonic snowflake ids: current time in the high bits, strictly increasing."""

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        candidate = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
        self._last = max(candidate, self._last + 1)
        return self._last


@dataclass(frozen=True)
class FakeUser:
    id: int
    username: str
    global_name: str | None = None
    bot: bool = False

    @property
    def mention(self) -> str:
        return f"<@{self.id}>"

    def payload(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": str(self.id),
            "username": self.username,
            "discriminator": "0",
            "global_name": self.global_name,
            "avatar": None,
            "public_flags": 0,
            "flags": 0,
            "banner": None,
            "accent_color": None,
            "avatar_decoration_data": None,
        }
        if self.bot:
            data["bot"] = True
        return data


@dataclass
class FakeChannel:
    """A guild text channel, a DM channel or a thread (see ``type``)."""

    id: int
    type: ChannelType
    name: str | None
    guild_id: int | None = None
    parent_id: int | None = None
    owner_id: int | None = None
    recipient: FakeUser | None = None
    position: int = 0
    message_count: int = 0
    created_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    @property
    def is_thread(self) -> bool:
        return self.type in (ChannelType.PUBLIC_THREAD, ChannelType.PRIVATE_THREAD)

    def payload(self) -> dict[str, Any]:
        if self.type is ChannelType.DM:
            assert self.recipient is not None
            return {
                "id": str(self.id),
                "type": int(self.type),
                "last_message_id": None,
                "flags": 0,
                "recipients": [self.recipient.payload()],
            }
        data: dict[str, Any] = {
            "id": str(self.id),
            "type": int(self.type),
            "guild_id": str(self.guild_id),
            "name": self.name,
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "flags": 0,
        }
        if self.is_thread:
            data.update(
                parent_id=str(self.parent_id),
                owner_id=str(self.owner_id),
                message_count=self.message_count,
                total_message_sent=self.message_count,
                member_count=1,
                thread_metadata={
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": iso(self.created_at),
                    "locked": False,
                    "create_timestamp": iso(self.created_at),
                },
            )
        else:
            data.update(
                position=self.position,
                parent_id=None,
                permission_overwrites=[],
                nsfw=False,
                topic=None,
            )
        return data


@dataclass
class FakeGuild:
    id: int
    name: str
    owner_id: int
    members: list[FakeUser]
    channel_ids: list[int] = field(default_factory=list)
    joined_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    def member_payload(self, user: FakeUser, *, with_user: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "roles": [],
            "nick": None,
            "avatar": None,
            "joined_at": iso(self.joined_at),
            "premium_since": None,
            "deaf": False,
            "mute": False,
            "pending": False,
            "flags": 0,
            "communication_disabled_until": None,
        }
        if with_user:
            data["user"] = user.payload()
        return data

    def everyone_role(self) -> dict[str, Any]:
        # The @everyone role shares the guild's id.
        return {
            "id": str(self.id),
            "name": "@everyone",
            "color": 0,
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": 0,
            "permissions": str(BOT_PERMISSIONS),
            "managed": False,
            "mentionable": False,
            "flags": 0,
        }


@dataclass(frozen=True)
class Pings:
    """Who a sent message actually notifies once ``allowed_mentions`` is applied."""

    everyone: bool
    users: frozenset[int]
    roles: frozenset[int]


def resolve_pings(
    content: str,
    allowed_mentions: Mapping[str, Any] | None,
    replied_author_id: int | None,
) -> Pings:
    """Apply Discord's allowed-mentions rules to a message's content.

    Without ``allowed_mentions`` everything in the content pings, and so does a reply's
    author. With it, only the types listed in ``parse`` plus the explicit ``users`` /
    ``roles`` id lists ping, and a reply pings its author only with ``replied_user``.
    """
    user_ids = {int(m) for m in _USER_MENTION.findall(content)}
    role_ids = {int(m) for m in _ROLE_MENTION.findall(content)}
    says_everyone = "@everyone" in content or "@here" in content
    if allowed_mentions is None:
        users = set(user_ids)
        if replied_author_id is not None:
            users.add(replied_author_id)
        return Pings(says_everyone, frozenset(users), frozenset(role_ids))
    parse = set(allowed_mentions.get("parse", []))
    allowed_users = {int(u) for u in allowed_mentions.get("users", [])}
    allowed_roles = {int(r) for r in allowed_mentions.get("roles", [])}
    users = user_ids if "users" in parse else user_ids & allowed_users
    roles = role_ids if "roles" in parse else role_ids & allowed_roles
    if replied_author_id is not None and allowed_mentions.get("replied_user", False):
        users = users | {replied_author_id}
    return Pings(says_everyone and "everyone" in parse, frozenset(users), frozenset(roles))


def allowed_mentions_error(allowed_mentions: Mapping[str, Any]) -> str | None:
    """Discord refuses ``parse: ["users"]`` together with a ``users`` list (and likewise
    for roles); returns the offending key or None."""
    parse = set(allowed_mentions.get("parse", []))
    for kind in ("users", "roles"):
        if kind in parse and allowed_mentions.get(kind):
            return kind
    return None


class DiscordWorld:
    """Everything the fake server knows: the bot, users, guilds, channels, messages."""

    def __init__(self, *, bot_name: str, privileged_intents: Iterable[str]) -> None:
        self.ids = Snowflakes()
        self.application_id = self.ids.next()
        # A bot user's id equals its application's id on Discord.
        self.bot = FakeUser(self.application_id, bot_name, bot=True)
        self.owner = FakeUser(self.ids.next(), "app-owner")
        self.privileged_intents = frozenset(privileged_intents)
        unknown = self.privileged_intents - PRIVILEGED_INTENTS.keys()
        if unknown:
            raise ValueError(f"unknown privileged intents: {sorted(unknown)}")
        self.users: dict[int, FakeUser] = {self.bot.id: self.bot, self.owner.id: self.owner}
        self.guilds: dict[int, FakeGuild] = {}
        self.channels: dict[int, FakeChannel] = {}
        self.messages: dict[int, dict[str, Any]] = {}

    # ---- building the world -------------------------------------------------------------

    def add_user(self, username: str, *, global_name: str | None = None, bot: bool = False) -> FakeUser:
        user = FakeUser(self.ids.next(), username, global_name, bot)
        self.users[user.id] = user
        return user

    def add_guild(self, name: str, members: Iterable[FakeUser]) -> FakeGuild:
        people = [self.bot, *(m for m in members if m.id != self.bot.id)]
        guild = FakeGuild(self.ids.next(), name, owner_id=self.owner.id, members=people)
        self.guilds[guild.id] = guild
        return guild

    def add_channel(self, guild: FakeGuild, name: str) -> FakeChannel:
        channel = FakeChannel(
            self.ids.next(), ChannelType.GUILD_TEXT, name, guild.id, position=len(guild.channel_ids)
        )
        guild.channel_ids.append(channel.id)
        self.channels[channel.id] = channel
        return channel

    def dm_with(self, user: FakeUser) -> FakeChannel:
        for channel in self.channels.values():
            if channel.type is ChannelType.DM and channel.recipient == user:
                return channel
        channel = FakeChannel(self.ids.next(), ChannelType.DM, None, recipient=user)
        self.channels[channel.id] = channel
        return channel

    def add_thread(
        self,
        parent: FakeChannel,
        name: str,
        owner: FakeUser,
        *,
        thread_id: int | None = None,
        private: bool = False,
    ) -> FakeChannel:
        if parent.type is not ChannelType.GUILD_TEXT:
            raise ValueError("threads live under guild text channels")
        kind = ChannelType.PRIVATE_THREAD if private else ChannelType.PUBLIC_THREAD
        thread = FakeChannel(thread_id or self.ids.next(), kind, name, parent.guild_id, parent.id, owner.id)
        self.channels[thread.id] = thread
        return thread

    def known_users(self, ids: Iterable[int]) -> list[FakeUser]:
        return [self.users[i] for i in sorted(ids) if i in self.users]

    def channel(self, channel_id: int) -> FakeChannel:
        return self.channels[channel_id]

    def guild_of(self, channel: FakeChannel) -> FakeGuild | None:
        return None if channel.guild_id is None else self.guilds[channel.guild_id]

    def threads_of(self, guild: FakeGuild) -> list[FakeChannel]:
        return [c for c in self.channels.values() if c.is_thread and c.guild_id == guild.id]

    # ---- payloads -----------------------------------------------------------------------

    def application_payload(self) -> dict[str, Any]:
        return {
            "id": str(self.application_id),
            "name": self.bot.username,
            "icon": None,
            "description": "",
            "summary": "",
            "type": None,
            "bot_public": True,
            "bot_require_code_grant": False,
            "verify_key": "0" * 64,
            "owner": self.owner.payload(),
            "team": None,
            "flags": self.application_flags(),
            "bot": self.bot.payload(),
            "interactions_endpoint_url": None,
            "tags": [],
        }

    def application_flags(self) -> int:
        flags = 0
        for name in self.privileged_intents:
            flags |= _APP_FLAG_FOR_INTENT[name]
        return flags

    def guild_create_payload(self, guild: FakeGuild) -> dict[str, Any]:
        # Without the privileged members intent Discord lists only the bot's own member.
        return {
            "id": str(guild.id),
            "name": guild.name,
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "owner_id": str(guild.owner_id),
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 1,
            "explicit_content_filter": 0,
            "roles": [guild.everyone_role()],
            "emojis": [],
            "stickers": [],
            "features": [],
            "mfa_level": 0,
            "system_channel_id": None,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "vanity_url_code": None,
            "description": None,
            "banner": None,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "preferred_locale": "en-US",
            "public_updates_channel_id": None,
            "nsfw_level": 0,
            "premium_progress_bar_enabled": False,
            "joined_at": iso(guild.joined_at),
            "large": False,
            "unavailable": False,
            "member_count": len(guild.members),
            "voice_states": [],
            "members": [guild.member_payload(self.bot)],
            "channels": [self.channels[cid].payload() for cid in guild.channel_ids],
            "threads": [t.payload() for t in self.threads_of(guild)],
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
        }

    def message_payload(
        self,
        *,
        channel: FakeChannel,
        author: FakeUser,
        content: str,
        mentions: Iterable[FakeUser] = (),
        mention_everyone: bool = False,
        mention_roles: Iterable[int] = (),
        reference_id: int | None = None,
        flags: int = 0,
        webhook_id: int | None = None,
    ) -> dict[str, Any]:
        """A stored message (also recorded in ``self.messages``)."""
        message_id = self.ids.next()
        guild = self.guild_of(channel)
        data: dict[str, Any] = {
            "id": str(message_id),
            "channel_id": str(channel.id),
            "author": author.payload(),
            "content": content,
            "timestamp": iso(snowflake_time(message_id)),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": mention_everyone,
            "mentions": [self._mention_payload(u, guild) for u in mentions],
            "mention_roles": [str(r) for r in mention_roles],
            "attachments": [],
            "embeds": [],
            "components": [],
            "pinned": False,
            "type": int(MessageType.DEFAULT),
            "flags": flags,
        }
        if guild is not None:
            data["guild_id"] = str(guild.id)
            if webhook_id is None:
                data["member"] = guild.member_payload(author, with_user=False)
        if webhook_id is not None:
            data["webhook_id"] = str(webhook_id)
            data["application_id"] = str(self.application_id)
        if channel.is_thread:
            data["position"] = channel.message_count
            channel.message_count += 1
        if reference_id is not None:
            referenced = self.messages[reference_id]
            data["type"] = int(MessageType.REPLY)
            data["message_reference"] = {
                "type": 0,
                "message_id": str(reference_id),
                "channel_id": referenced["channel_id"],
                **({"guild_id": str(guild.id)} if guild is not None else {}),
            }
            # Discord nests one level only: the quoted message carries no quote of its own.
            data["referenced_message"] = {k: v for k, v in referenced.items() if k != "referenced_message"}
        self.messages[message_id] = data
        return data

    def _mention_payload(self, user: FakeUser, guild: FakeGuild | None) -> dict[str, Any]:
        data = user.payload()
        if guild is not None and user in guild.members:
            data["member"] = guild.member_payload(user, with_user=False)
        return data

    def as_seen_without_content(self, message: dict[str, Any]) -> dict[str, Any]:
        """What a session without the message-content intent receives for a guild message
        that neither mentions the bot nor was sent by it: content, embeds, attachments and
        components blanked (DMs and mentions keep them, as on Discord)."""
        if "guild_id" not in message or message["author"]["id"] == str(self.bot.id):
            return message
        if any(m["id"] == str(self.bot.id) for m in message["mentions"]):
            return message
        return {**message, "content": "", "embeds": [], "attachments": [], "components": []}
