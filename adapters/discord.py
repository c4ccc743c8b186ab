"""The Discord adapter: discord.py 2.x ``Client`` ↔ the gateway's ``Adapter`` port.

Receiving. DMs always; in a server only what is addressed to the bot: a message that
mentions it (the user or its managed role), a reply to one of its messages, or any
message in a thread the bot owns. The bot's own messages (Discord echoes them) and other
bots' are ignored, and so is every other event (debug log). Channel allowlists are the
gateway's job (``gateway.access``), not this module's. A thread message is keyed on its
parent channel (``chat_id``) plus ``thread_id``. In a ``thread_reply_channels`` channel
an addressed message first gets a thread started from it (owned by the bot, so the
conversation continues there without mentions).

Sending. Every send goes through ``_post`` and carries ``allowed_mentions`` that can
only ping the member being answered — and ``@everyone`` / ``@here`` in the text are
broken with a zero-width joiner as well, so a call that somehow lost its
``allowed_mentions`` still cannot ping a server. Replies are split at 2,000 characters
(``gateway.splitting``, code fences closed and reopened). Each chunk carries a nonce
derived from its outbox row: Discord (``enforce_nonce``) returns the message already
created for a repeated nonce, so an outbox re-send after a crash or a partial failure
does not post twice (while Discord remembers the nonce, "a few minutes").

Application commands. The gateway's slash commands are registered as global commands
(only re-synced when they differ from what Discord has; command creation is rate
limited). An interaction is deferred at once, ephemerally (Discord wants an answer
within 3 s), then becomes an ``InboundMessage`` with text ``/name args`` and message id
``i<interaction id>``; the gateway's reply to that id is sent as the interaction's
ephemeral followup, so ``/memory`` is seen by the caller only. The interaction token
lives 15 minutes and only in this process: when it is gone, the answer goes to the
caller's DMs — never to the channel, where everyone would read it.

Streaming (``gateway.ports.StreamsReplies``, DMs by default): ``stream_open`` posts one
message that pings nobody and ``stream_edit`` edits it, at most once per
``stream_interval_s`` (Discord allows about five edits per five seconds in a channel).
The final reply edits that message into its first chunk — after the same gap — and
posts the other chunks as usual; a streamed message that is gone is replaced by a new
one. Interaction answers are never streamed (they go out as ephemeral followups).

Errors. discord.py retries 429s (honouring ``retry_after``) and 500/502/504 itself;
whatever still fails is mapped to ``gateway.errors`` in ``platform_errors`` — the one
place — so the outbox retries later (rate limit, outage) or gives up (forbidden).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import discord
from discord import app_commands

from mnemo.adapters.chat_typing import TypingLoops
from mnemo.adapters.discord_routing import route_discord
from mnemo.adapters.splitting import split_message
from mnemo.gateway.config import DiscordSettings
from mnemo.gateway.delivery.live import fit_utf16
from mnemo.gateway.errors import (
    Forbidden,
    PlatformError,
    PlatformRateLimited,
    PlatformUnavailable,
    StartupError,
)
from mnemo.gateway.events import (
    Attachment,
    ChatRef,
    ChatType,
    InboundMessage,
    OutboundMessage,
    Submitted,
    delivery_label,
)
from mnemo.gateway.logs import get_logger
from mnemo.gateway.media import clean_file_name
from mnemo.gateway.ports import CommandInfo, InboundSink

log = get_logger(__name__)

MAX_LEN = 2000
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024  # what gateway.media reads of one attachment
NONCE_MAX = 25  # Discord's limit on a message nonce, in characters
# Discord keeps an interaction token for 15 minutes; stop trusting it a little earlier.
INTERACTION_TTL_S = 14 * 60
# Commands of the gateway that act on text (``/search WORDS``) get one optional string
# option on Discord.
_ZWJ = "\u200d"
_MASS_MENTION = re.compile(r"@(everyone|here)")
_COMMAND_NAME = re.compile(r"^[-_a-z0-9]{1,32}$")
_THREAD_ALREADY_EXISTS = 160004


def intents() -> discord.Intents:
    """Guilds (channels, threads), server and DM messages, and message content — the
    last one privileged: switch it on in the developer portal. No members/presences."""
    wanted = discord.Intents.none()
    wanted.guilds = True
    wanted.guild_messages = True
    wanted.dm_messages = True
    wanted.message_content = True
    return wanted


@contextlib.contextmanager
def platform_errors(action: str) -> Iterator[None]:
    """Map discord.py / aiohttp failures of ``action`` onto ``gateway.errors``."""
    try:
        yield
    except discord.RateLimited as e:  # longer than max_ratelimit_timeout: let the outbox wait
        raise PlatformRateLimited(f"Discord rate limit on {action}", e.retry_after) from e
    except discord.Forbidden as e:
        raise Forbidden(f"Discord refused {action}: {e.code} {e.text}") from e
    except discord.NotFound as e:  # unknown channel / user: retrying cannot help
        raise Forbidden(f"Discord has no target for {action}: {e.code} {e.text}") from e
    except discord.DiscordServerError as e:
        raise PlatformUnavailable(f"Discord failed {action}: {e.status} {e.text}") from e
    except discord.HTTPException as e:
        if e.status == 429:  # still limited after discord.py's own retries
            raise PlatformRateLimited(f"Discord rate limit on {action}", _retry_after(e)) from e
        if e.status == 401:  # token revoked: replies wait for an operator to fix it
            raise PlatformUnavailable(f"Discord rejected the bot token during {action}") from e
        # Any other 4xx is a refusal of this message; sending it again changes nothing.
        raise Forbidden(f"Discord refused {action}: {e.status} {e.code} {e.text}") from e
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise PlatformUnavailable(f"cannot reach Discord for {action}: {type(e).__name__}: {e}") from e
    except discord.ClientException as e:  # e.g. the client was closed under us
        raise PlatformUnavailable(f"Discord client unavailable for {action}: {e}") from e


def _retry_after(e: discord.HTTPException) -> float:
    header = e.response.headers.get("Retry-After") if e.response is not None else None
    try:
        return max(0.0, float(header)) if header else 1.0
    except ValueError:
        return 1.0


def _live_text(text: str) -> str:
    """A live reply's text: mass mentions broken (which lengthens it), then cut to fit."""
    return fit_utf16(neutralise_mass_mentions(text), MAX_LEN)


def neutralise_mass_mentions(text: str) -> str:
    """``@everyone``/``@here`` → ``@\u200deveryone``: shown the same, pings nobody."""
    return _MASS_MENTION.sub(lambda m: "@" + _ZWJ + m.group(1), text)


def chunk_nonce(outbox_id: int, index: int, salt: str) -> str:
    """A nonce (≤ 25 chars) stable across re-sends of one outbox row's chunk ``index``.
    ``salt`` (target and replied-to ids) keeps a fresh database's row 1 from colliding
    with an old row 1 that Discord may still remember."""
    prefix = f"{outbox_id:x}.{index}."
    digest = hashlib.sha256(salt.encode()).hexdigest()
    return prefix + digest[: max(0, NONCE_MAX - len(prefix))][:8]


def label(message: OutboundMessage) -> str:
    marks = delivery_label(message)
    return marks + "\n" if marks else ""


def allowed_mentions(user_id: str | None) -> discord.AllowedMentions:
    users = [discord.Object(int(user_id))] if user_id is not None and user_id.isdigit() else []
    return discord.AllowedMentions(everyone=False, roles=False, users=users, replied_user=bool(users))


@dataclass(frozen=True, slots=True)
class _Pending:
    interaction: discord.Interaction
    at: float


# The channels a reply is sent to and a sent message edited in (by id): not a forum or a
# category, which are guild channels without messages of their own.
_Channel = (
    discord.TextChannel
    | discord.VoiceChannel
    | discord.StageChannel
    | discord.Thread
    | discord.DMChannel
    | discord.PartialMessageable
)


@dataclass(frozen=True, slots=True)
class _Target:
    channel: _Channel
    id: int
    in_guild: bool  # replies in servers quote the message they answer


class _InteractionGone(Exception):
    """The interaction token expired or is unknown to Discord: answer by DM instead."""


class _Client(discord.Client):
    def __init__(self, adapter: DiscordAdapter, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]  # discord.py types Client's and AutoShardedClient's options apart
        self.adapter = adapter
        self.tree = app_commands.CommandTree(self)

    async def on_message(self, message: discord.Message) -> None:
        await self.adapter._on_message(message)


class _ShardedClient(_Client, discord.AutoShardedClient):
    """The same client on the shards ``discord.shard_ids`` of ``discord.shard_count``
    (one gateway connection per shard; Discord routes each guild to one shard)."""


class DiscordAdapter:
    name = "discord"
    max_message_len = MAX_LEN
    supports_typing = True
    debounce_s: float | None = None
    stream_tokens = False

    def __init__(
        self,
        settings: DiscordSettings,
        *,
        ready_timeout_s: float = 60.0,
        guild_ready_timeout_s: float = 2.0,
        max_ratelimit_timeout_s: float = 30.0,
        stream_interval_s: float = 1.0,
        typing_interval_s: float = 8.0,
    ) -> None:
        self.settings = settings
        self.stream_interval_s = stream_interval_s
        # Discord shows typing for about 10 s after one request.
        self._typing = TypingLoops(self._send_typing, interval_s=typing_interval_s, platform="discord")
        self._stream_edited: dict[str, float] = {}  # message id → monotonic time before which no edit
        self.menu: list[CommandInfo] = []  # the gateway's commands, given to start()
        self.ready_timeout_s = ready_timeout_s
        self.guild_ready_timeout_s = guild_ready_timeout_s
        # discord.py refuses values under 30 s; longer limits go back to the outbox.
        self.max_ratelimit_timeout_s = max(30.0, max_ratelimit_timeout_s)
        self._shared = frozenset(settings.shared_room_channels)
        self._thread_channels = frozenset(settings.thread_reply_channels)
        self._client: _Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._sink: InboundSink | None = None
        self._interactions: dict[str, _Pending] = {}

    # --- lifecycle -------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        client = self._client
        return (
            client is not None
            and self._task is not None
            and not self._task.done()
            and client.is_ready()
            and not client.is_closed()
        )

    async def start(self, sink: InboundSink, commands: Sequence[CommandInfo] = ()) -> None:
        """Log in, connect the gateway, sync the application commands. Raises
        ``StartupError`` for a configuration error (no token, a token Discord refuses,
        the Message Content intent not enabled) and ``PlatformUnavailable`` when Discord
        cannot be reached (the supervisor calls ``start`` again; a failed start closes
        its client, so the next call begins afresh)."""
        if self._client is not None:
            return
        self.menu = list(commands)
        if self.settings.bot_token is None:
            raise StartupError("DISCORD_BOT_TOKEN is not set")
        route_discord(self.settings.api_base_url, self.settings.gateway_url)
        self._sink = sink
        client = self._new_client()
        self._register_commands(client.tree)
        self._client = client
        try:
            await self._connect(client, self.settings.bot_token.get_secret_value())
        except BaseException:
            await self.stop()
            raise
        await self._sync_commands(client.tree)
        assert client.user is not None
        log.info(
            "discord_ready",
            bot_id=client.user.id,
            guilds=len(client.guilds),
            shards=list(self.settings.shard_ids) or self.settings.shard_count,
        )

    def _new_client(self) -> _Client:
        options: dict[str, object] = {
            "intents": intents(),
            "guild_ready_timeout": self.guild_ready_timeout_s,
            "max_ratelimit_timeout": self.max_ratelimit_timeout_s,
        }
        if self.settings.shard_count is None:
            return _Client(self, **options)
        options["shard_count"] = self.settings.shard_count
        if self.settings.shard_ids:  # none listed: this process connects every shard
            options["shard_ids"] = list(self.settings.shard_ids)
        return _ShardedClient(self, **options)

    async def _connect(self, client: _Client, token: str) -> None:
        try:
            await client.login(token)
        except discord.LoginFailure as e:
            raise StartupError(
                "Discord refused DISCORD_BOT_TOKEN (401): reset the token in the developer portal"
            ) from e
        except (aiohttp.ClientError, OSError, TimeoutError, discord.HTTPException) as e:
            # Unreachable or failing (5xx, a 4xx other than 401): the supervisor retries.
            raise PlatformUnavailable(f"cannot log in to Discord: {type(e).__name__}: {e}") from e
        self._task = asyncio.create_task(client.connect(reconnect=True), name="discord-gateway")
        self._task.add_done_callback(self._connection_ended)
        ready = asyncio.create_task(client.wait_until_ready(), name="discord-ready")
        done, _ = await asyncio.wait(
            {ready, self._task}, timeout=self.ready_timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if ready in done:
            return
        ready.cancel()
        await asyncio.gather(ready, return_exceptions=True)
        if self._task not in done:  # discord.py is still reconnecting: the gateway is unreachable
            raise PlatformUnavailable(f"Discord gateway not ready after {self.ready_timeout_s:.0f} s")
        error = self._task.exception()
        if isinstance(error, discord.PrivilegedIntentsRequired):
            raise StartupError(
                "Discord refused the Message Content intent: enable it under Bot → Privileged Gateway Intents"
            ) from error
        if isinstance(error, discord.LoginFailure):
            raise StartupError("Discord refused DISCORD_BOT_TOKEN on the gateway") from error
        if isinstance(error, discord.ConnectionClosed) and error.code == 4004:  # "Authentication failed"
            raise StartupError("Discord refused DISCORD_BOT_TOKEN on the gateway (4004)") from error
        raise PlatformUnavailable(
            f"Discord gateway connection failed: {type(error).__name__}: {error}"
        ) from error

    def _connection_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._client is not None:
            log.error(
                "discord_gateway_stopped", error=f"{type(task.exception()).__name__}: {task.exception()}"
            )

    async def stop(self) -> None:
        client, task = self._client, self._task
        self._client, self._task = None, None
        self._interactions.clear()
        await self._typing.close()
        if client is not None:
            await client.close()
        if task is not None:
            # connect() returns once the client is closed; an error it ended with was logged.
            await asyncio.gather(task, return_exceptions=True)

    # --- application commands --------------------------------------------------------

    def _register_commands(self, tree: app_commands.CommandTree[_Client]) -> None:
        for command in self.menu:
            name, summary = command.name, command.summary
            if not _COMMAND_NAME.match(name):
                log.warning(
                    "discord_command_skipped", command=name, reason="not a valid Discord command name"
                )
                continue
            description = summary if len(summary) <= 100 else summary[:99] + "…"
            tree.add_command(
                app_commands.Command(
                    name=name,
                    description=description or name,
                    callback=self._command_callback(name, takes_text=command.takes_args),
                )
            )

    def _command_callback(self, name: str, *, takes_text: bool) -> Callable[..., Coroutine[Any, Any, None]]:
        # discord.py reads the options off the callback's signature.
        if takes_text:

            @app_commands.describe(text="what the command acts on")
            async def with_text(interaction: discord.Interaction, text: str | None = None) -> None:
                await self._on_command(interaction, name, text or "")

            return with_text

        async def plain(interaction: discord.Interaction) -> None:
            await self._on_command(interaction, name, "")

        return plain

    async def _sync_commands(self, tree: app_commands.CommandTree[_Client]) -> None:
        """Overwrite Discord's global commands only when they differ from ours."""
        wanted = {
            (c.name, c.description, tuple((p.name, p.required) for p in c.parameters))
            for c in tree.get_commands()
            if isinstance(c, app_commands.Command)
        }
        try:
            with platform_errors("listing application commands"):
                remote = await tree.fetch_commands()
            have = {(c.name, c.description, tuple(_option(o) for o in c.options)) for c in remote}
            if have == wanted:
                return
            with platform_errors("registering application commands"):
                await tree.sync()
            log.info("discord_commands_synced", count=len(wanted))
        except (Forbidden, PlatformUnavailable, PlatformRateLimited) as e:
            # Messages still work without slash commands; say why they are missing.
            log.warning("discord_commands_not_synced", error=str(e))

    async def _on_command(self, interaction: discord.Interaction, name: str, text: str) -> None:
        key = f"i{interaction.id}"
        try:
            await interaction.response.defer(ephemeral=True, thinking=True)
        except discord.HTTPException as e:  # already answered or expired: nothing to reply to
            log.warning("discord_interaction_not_deferred", command=name, error=f"{e.status} {e.code}")
            return
        now = time.monotonic()
        for stale in [k for k, p in self._interactions.items() if now - p.at > INTERACTION_TTL_S]:
            del self._interactions[stale]
        self._interactions[key] = _Pending(interaction, now)
        msg = self._from_interaction(interaction, key, f"/{name} {text}".strip())
        outcome = await self._submit(msg)
        if outcome in (Submitted.DROPPED, Submitted.DUPLICATE) and key in self._interactions:
            # No reply will come: close the "thinking…" state instead of leaving it to expire.
            pending = self._interactions.pop(key)
            note = "Already handled." if outcome is Submitted.DUPLICATE else "Not available here."
            with contextlib.suppress(discord.HTTPException, aiohttp.ClientError):
                await pending.interaction.followup.send(note, ephemeral=True)

    def _from_interaction(self, interaction: discord.Interaction, key: str, text: str) -> InboundMessage:
        channel = interaction.channel
        chat_id, thread_id = str(interaction.channel_id), None
        if isinstance(channel, discord.Thread):
            chat_id, thread_id = str(channel.parent_id), str(channel.id)
        return InboundMessage(
            platform=self.name,
            chat_id=chat_id,
            thread_id=thread_id,
            user_id=str(interaction.user.id),
            user_name=interaction.user.display_name,
            message_id=key,
            text=text,
            chat_type=ChatType.DM if interaction.guild_id is None else ChatType.GROUP,
            mentioned=True,
            received_at=interaction.created_at,
            shared_room=self._is_shared(chat_id, thread_id),
            private=True,  # answered with an ephemeral followup (or by DM)
        )

    # --- receiving -------------------------------------------------------------------

    async def _submit(self, msg: InboundMessage) -> Submitted | None:
        assert self._sink is not None
        try:
            return await self._sink(msg)
        except Exception:  # loop boundary: one bad message never stops the adapter
            log.exception("discord_inbound_failed", message_id=msg.message_id)
            return None

    async def _on_message(self, message: discord.Message) -> None:
        client = self._client
        if client is None or client.user is None or self._sink is None:
            return
        try:
            msg = await self._inbound(message, client.user.id)
        except Exception:  # loop boundary: a message we cannot read is logged, not fatal
            log.exception("discord_inbound_failed", message_id=message.id)
            return
        if msg is not None:
            await self._submit(msg)

    async def _inbound(self, message: discord.Message, bot_id: int) -> InboundMessage | None:
        """The InboundMessage for an addressed message, or None (logged at debug)."""
        if message.author.id == bot_id or message.author.bot or message.webhook_id is not None:
            return None  # our own echo, other bots, webhooks
        if message.type not in (discord.MessageType.default, discord.MessageType.reply):
            log.debug("discord_event_dropped", reason="message type", type=str(message.type))
            return None
        channel = message.channel
        is_dm = isinstance(channel, discord.DMChannel)
        if not is_dm and message.guild is None:
            log.debug("discord_event_dropped", reason="group DM or unknown channel")
            return None
        text, mentioned = strip_bot_mention(message, bot_id)
        resolved = message.reference.resolved if message.reference is not None else None
        quoted = resolved if isinstance(resolved, discord.Message) else None
        replies_to_bot = quoted is not None and quoted.author.id == bot_id
        in_own_thread = isinstance(channel, discord.Thread) and channel.owner_id == bot_id
        if not (is_dm or mentioned or replies_to_bot or in_own_thread):
            log.debug("discord_event_dropped", reason="not addressed to the bot")
            return None
        attachments = tuple(_attachment(a) for a in message.attachments)
        if not text and not attachments:
            log.debug("discord_event_dropped", reason="no text or attachments")
            return None
        chat_id, thread_id = str(channel.id), None
        if isinstance(channel, discord.Thread):
            chat_id, thread_id = str(channel.parent_id), str(channel.id)
        elif chat_id in self._thread_channels and isinstance(channel, discord.TextChannel):
            thread_id = await self._start_thread(message, text)
        return InboundMessage(
            platform=self.name,
            chat_id=chat_id,
            thread_id=thread_id,
            user_id=str(message.author.id),
            user_name=message.author.display_name,
            message_id=str(message.id),
            text=text,
            chat_type=ChatType.DM if is_dm else ChatType.GROUP,
            mentioned=mentioned,
            attachments=attachments,
            reply_to=(quoted.content or None) if quoted is not None else None,
            received_at=message.created_at,
            shared_room=not is_dm and self._is_shared(chat_id, thread_id),
        )

    def _is_shared(self, chat_id: str, thread_id: str | None) -> bool:
        return chat_id in self._shared or (thread_id is not None and thread_id in self._shared)

    async def _start_thread(self, message: discord.Message, text: str) -> str | None:
        """A thread from ``message`` (owned by the bot, same id as the message); None if
        it cannot be created, and the answer goes to the channel instead."""
        first_line = text.splitlines()[0].strip() if text else ""
        name = (first_line or f"{message.author.display_name}'s question")[:90]
        try:
            thread = await message.create_thread(name=name)
        except discord.HTTPException as e:
            if e.code == _THREAD_ALREADY_EXISTS:  # redelivered message: the thread is ours
                return str(message.id)
            error = f"{e.status} {e.code} {e.text}"
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            error = f"{type(e).__name__}: {e}"
        else:
            return str(thread.id)
        log.warning("discord_thread_not_created", channel=message.channel.id, error=error)
        return None

    # --- media ---------------------------------------------------------------------------

    async def fetch_media(self, attachment: Attachment) -> bytes:
        """The attachment's CDN URL, read through discord.py's HTTP client
        (``ports.FetchesMedia``)."""
        client = self._client
        if client is None or client.is_closed():
            raise PlatformUnavailable("Discord is not connected")
        if attachment.size is not None and attachment.size > MAX_DOWNLOAD_BYTES:
            raise PlatformError(f"attachment too large: {attachment.size} bytes")
        try:
            return await client.http.get_from_cdn(attachment.ref)
        except discord.HTTPException as e:
            raise PlatformUnavailable(f"Discord attachment download failed: {e}") from e

    # --- sending ---------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> list[str]:
        client = self._client
        if client is None or client.is_closed():
            raise PlatformUnavailable("the Discord client is not running")
        text = neutralise_mass_mentions(label(message) + message.text)
        chunks = split_message(text, MAX_LEN)
        if not chunks:
            return []
        key = message.reply_to_message_id
        with platform_errors("sending a message"):
            if key is not None and key.startswith("i"):
                return await self._answer_interaction(client, key, message, chunks)
            return await self._post(self._target(client, message.chat), message, chunks)

    async def _answer_interaction(
        self, client: _Client, key: str, message: OutboundMessage, chunks: list[str]
    ) -> list[str]:
        pending = self._interactions.get(key)
        if pending is not None and time.monotonic() - pending.at <= INTERACTION_TTL_S:
            try:
                ids = await self._followup(pending.interaction, message, chunks)
            except _InteractionGone:
                log.info("discord_interaction_expired", interaction=key)
            else:
                self._interactions.pop(key, None)
                return ids
        self._interactions.pop(key, None)
        # The answer may be private (/memory): never post it in the channel.
        if message.mention_user_id is None or not message.mention_user_id.isdigit():
            raise Forbidden(f"interaction {key} expired and there is no user to answer by DM")
        dm = await client.create_dm(discord.Object(int(message.mention_user_id)))
        return await self._post(_Target(dm, dm.id, in_guild=False), message, chunks)

    async def _followup(
        self, interaction: discord.Interaction, message: OutboundMessage, chunks: list[str]
    ) -> list[str]:
        ids: list[str] = []
        for chunk in chunks:
            try:
                sent = await interaction.followup.send(
                    chunk,
                    ephemeral=True,
                    allowed_mentions=allowed_mentions(message.mention_user_id),
                    wait=True,
                )
            except discord.HTTPException as e:
                if e.status in (401, 404) and not ids:  # invalid / unknown webhook token
                    raise _InteractionGone from e
                raise
            ids.append(str(sent.id))
        return ids

    async def _post(self, target: _Target, message: OutboundMessage, chunks: list[str]) -> list[str]:
        reply_to = message.reply_to_message_id
        reference = None
        # In DMs a quote is noise; a thread started from the message shows it at its top.
        if (
            target.in_guild
            and reply_to is not None
            and reply_to.isdigit()
            and reply_to != message.chat.thread_id
        ):
            reference = discord.MessageReference(
                message_id=int(reply_to), channel_id=target.id, fail_if_not_exists=False
            )
        ids = []
        if message.stream_message_id is not None:
            ids.append(await self._finish_stream(target, message, chunks[0]))
        for index, chunk in enumerate(chunks):
            if index < len(ids):
                continue
            nonce = None
            if message.outbox_id is not None:
                nonce = chunk_nonce(message.outbox_id, index, f"{target.id}:{reply_to}")
            sent = await target.channel.send(
                chunk,
                reference=reference if index == 0 else None,  # type: ignore[arg-type]  # send() takes None (its default); its overloads omit it
                allowed_mentions=allowed_mentions(message.mention_user_id),
                nonce=nonce,  # type: ignore[arg-type]  # as reference: None (the default) makes discord.py pick a nonce
            )
            ids.append(str(sent.id))
        return ids

    # --- streaming (ports.StreamsReplies) -----------------------------------------------

    async def stream_open(self, chat: ChatRef, text: str, *, reply_to: str | None) -> str:
        client = self._client
        if client is None or client.is_closed():
            raise PlatformUnavailable("the Discord client is not running")
        if reply_to is not None and reply_to.startswith("i"):
            raise Forbidden("an interaction's answer is not streamed")
        with platform_errors("showing a reply"):
            sent = await self._target(client, chat).channel.send(
                _live_text(text), allowed_mentions=discord.AllowedMentions.none()
            )
        self._hold_edits(str(sent.id))
        return str(sent.id)

    async def stream_edit(self, chat: ChatRef, message_id: str, text: str) -> None:
        client = self._client
        if client is None or client.is_closed():
            raise PlatformUnavailable("the Discord client is not running")
        with platform_errors("updating a reply"):
            await (
                self._target(client, chat)
                .channel.get_partial_message(int(message_id))
                .edit(content=_live_text(text), allowed_mentions=discord.AllowedMentions.none())
            )
        self._hold_edits(message_id)

    def _hold_edits(self, message_id: str) -> None:
        self._stream_edited[message_id] = time.monotonic() + self.stream_interval_s
        while len(self._stream_edited) > 1024:
            self._stream_edited.pop(next(iter(self._stream_edited)))

    async def _finish_stream(self, target: _Target, message: OutboundMessage, chunk: str) -> str:
        """The streamed message becomes the first chunk; a new message when it is gone."""
        stream_id = message.stream_message_id
        assert stream_id is not None
        wait = self._stream_edited.pop(stream_id, 0.0) - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            await target.channel.get_partial_message(int(stream_id)).edit(
                content=chunk, allowed_mentions=allowed_mentions(message.mention_user_id)
            )
        except discord.NotFound:
            log.info("discord_streamed_message_gone", chat=message.chat.chat_id)
            sent = await target.channel.send(
                chunk, allowed_mentions=allowed_mentions(message.mention_user_id)
            )
            return str(sent.id)
        return stream_id

    def _target(self, client: _Client, chat: ChatRef) -> _Target:
        target = int(chat.thread_id or chat.chat_id)
        channel = client.get_channel(target)
        if isinstance(
            channel, discord.TextChannel | discord.VoiceChannel | discord.StageChannel | discord.Thread
        ):
            return _Target(channel, target, in_guild=True)
        if isinstance(channel, discord.DMChannel):
            return _Target(channel, target, in_guild=False)
        # Not cached (a DM channel after a restart, an archived thread), or a channel that
        # holds no messages (a forum, a category): send by id, and Discord answers.
        return _Target(client.get_partial_messageable(target), target, in_guild=False)

    def typing(self, chat: ChatRef) -> contextlib.AbstractAsyncContextManager[None]:
        """``typing…`` while the turn runs (``adapters.chat_typing``): one loop per
        channel, re-sent every ``typing_interval_s``; best effort — a failure to show
        typing never fails the turn."""
        return self._typing.hold(chat)

    async def _send_typing(self, chat: ChatRef) -> None:
        client = self._client
        if client is None:
            return
        try:
            await self._target(client, chat).channel.typing()  # awaited: one request
        except (discord.HTTPException, aiohttp.ClientError, OSError) as e:
            log.debug("discord_typing_failed", chat=chat.chat_id, error=f"{type(e).__name__}: {e}")


def _option(option: app_commands.Argument | app_commands.AppCommandGroup) -> tuple[str, bool | None]:
    """A registered command's option as ``_sync_commands`` compares it with ours: a
    subcommand or group (put there by another program) has no ``required`` and differs."""
    return option.name, option.required if isinstance(option, app_commands.Argument) else None


def strip_bot_mention(message: discord.Message, bot_id: int) -> tuple[str, bool]:
    """The message text without the bot's mention, other members' mentions shown as
    ``@name``; and whether the bot (its user or its managed role) was mentioned."""
    text = message.content
    # Spaces around the mention go with it; line breaks stay (code blocks keep their shape).
    own = re.compile(rf"[ \t]*<@!?{bot_id}>[ \t]*")
    mentioned = bool(own.search(text))
    text = own.sub(" ", text)
    role = message.guild.self_role if message.guild is not None else None
    if role is not None and f"<@&{role.id}>" in text:
        mentioned = True
        text = re.sub(rf"[ \t]*<@&{role.id}>[ \t]*", " ", text)
    for user in message.mentions:
        if user.id != bot_id:
            shown = f"@{user.display_name}"
            text = text.replace(f"<@{user.id}>", shown).replace(f"<@!{user.id}>", shown)
    return text.strip(), mentioned


def _attachment(a: discord.Attachment) -> Attachment:
    kind = (a.content_type or "").split("/", 1)[0]
    if a.is_voice_message():
        kind = "voice"
    elif kind == "image":
        kind = "photo"
    elif kind not in ("audio", "video"):
        kind = "document"
    readable = kind in ("photo", "document", "voice", "audio")
    return Attachment(
        kind=kind,
        name=clean_file_name(a.filename),
        size=a.size,
        ref=a.url if readable else "",
        media_type=a.content_type or "",
    )
