"""The fake Discord's channel and message routes: send, fetch, edit, delete, typing,
threads and DM channels — and the record of everything the bot posted.

Sending follows Discord's rules an adapter must live with: content over 2,000 chars is
400 / 50035, an empty message 400 / 50006, ``parse: ["users"]`` together with a
``users`` list 400 / 50035, a reply to an unknown message 400 / 50035. A stored message
is echoed through the gateway as MESSAGE_CREATE (the bot sees its own messages, as on
Discord) unless it is ephemeral. ``allowed_mentions`` is applied and the outcome kept as
``SentMessage.pings``. ``enforce_nonce`` (discord.py sets it on every send) is honoured:
a send repeating an earlier nonce returns the earlier message and posts nothing — so an
outbox re-sending with a stable nonce (at most 25 chars) cannot double-post, as long as
Discord still remembers the nonce ("a few minutes"; the fake never forgets).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.discord_gateway import FakeGateway
from tests.fakes.discord_http import BODY, FILES, ApiError, invalid_form, json_response
from tests.fakes.discord_world import (
    ChannelType,
    DiscordWorld,
    FakeChannel,
    Pings,
    allowed_mentions_error,
    resolve_pings,
)

MAX_CONTENT = 2000
MAX_NONCE = 25  # characters, per Discord's create-message docs
EPHEMERAL = 1 << 6


@dataclass(frozen=True)
class SentMessage:
    """A message the bot created (channel send, interaction reply or followup)."""

    id: int
    channel_id: int
    body: Mapping[str, Any]  # the request JSON exactly as discord.py sent it
    pings: Pings  # who is notified once allowed_mentions is applied
    files: tuple[str, ...] = ()
    at: float = field(default_factory=time.monotonic)  # when the fake created it

    @property
    def content(self) -> str:
        return self.body.get("content") or ""

    @property
    def allowed_mentions(self) -> Mapping[str, Any] | None:
        return self.body.get("allowed_mentions")

    @property
    def message_reference(self) -> Mapping[str, Any] | None:
        return self.body.get("message_reference")

    @property
    def flags(self) -> int:
        return int(self.body.get("flags") or 0)


@dataclass(frozen=True)
class EditedMessage:
    message_id: int
    channel_id: int
    body: Mapping[str, Any]
    at: float = field(default_factory=time.monotonic)  # when the fake applied it


def _too_long() -> ApiError:
    return invalid_form("content", "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_CONTENT} or fewer in length.")


class MessageDesk:
    """Routes under ``/channels`` and ``/users/@me/channels``; records ``sent`` (channel
    sends only), ``edits``, ``deleted`` and ``typing`` (channel ids)."""

    def __init__(self, world: DiscordWorld, gateway: FakeGateway, file_base: Callable[[], str]) -> None:
        self._world = world
        self._gateway = gateway
        self._file_base = file_base
        self.sent: list[SentMessage] = []
        self.edits: list[EditedMessage] = []
        self.deleted: list[int] = []
        self.typing: list[int] = []
        self._nonces: dict[str, int] = {}  # nonce -> message id (the bot is the only author)

    def add_routes(self, router: web.UrlDispatcher, prefix: str) -> None:
        p = prefix
        router.add_post(p + "/users/@me/channels", self._open_dm)
        router.add_get(p + "/channels/{cid}", self._get_channel)
        router.add_post(p + "/channels/{cid}/messages", self._create_message)
        router.add_get(p + "/channels/{cid}/messages/{mid}", self._get_message)
        router.add_patch(p + "/channels/{cid}/messages/{mid}", self._edit_message)
        router.add_delete(p + "/channels/{cid}/messages/{mid}", self._delete_message)
        router.add_post(p + "/channels/{cid}/typing", self._typing)
        router.add_post(p + "/channels/{cid}/messages/{mid}/threads", self._thread_from_message)
        router.add_post(p + "/channels/{cid}/threads", self._thread_without_message)

    # ---- shared with the interaction routes ---------------------------------------------

    async def post(
        self,
        channel: FakeChannel,
        body: Mapping[str, Any],
        files: Sequence[str],
        *,
        webhook: bool = False,
    ) -> SentMessage:
        """Validate and store a bot message; dispatch it unless ephemeral."""
        content = body.get("content") or ""
        if len(content) > MAX_CONTENT:
            raise _too_long()
        if not (content or body.get("embeds") or files or body.get("sticker_ids") or body.get("poll")):
            raise ApiError(400, 50006, "Cannot send an empty message")
        allowed = body.get("allowed_mentions")
        if allowed is not None and (bad := allowed_mentions_error(allowed)) is not None:
            raise invalid_form(
                "allowed_mentions",
                "MESSAGE_ALLOWED_MENTIONS_PARSE_EXCLUSIVE",
                f'parse:["{bad}"] and {bad}: [ids...] are mutually exclusive.',
            )
        reference_id, replied_author = None, None
        if (ref := body.get("message_reference")) is not None:
            referenced = self._world.messages.get(int(ref.get("message_id", 0)))
            if referenced is None:
                raise invalid_form(
                    "message_reference", "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "Unknown message"
                )
            reference_id, replied_author = int(ref["message_id"]), int(referenced["author"]["id"])
        pings = resolve_pings(content, allowed, replied_author)
        flags = int(body.get("flags") or 0)
        message = self._world.message_payload(
            channel=channel,
            author=self._world.bot,
            content=content,
            mentions=self._world.known_users(pings.users),
            mention_everyone=pings.everyone,
            mention_roles=pings.roles,
            reference_id=reference_id,
            flags=flags,
            webhook_id=self._world.application_id if webhook else None,
        )
        message["embeds"] = list(body.get("embeds") or [])
        if body.get("nonce") is not None:
            message["nonce"] = body["nonce"]
        message["attachments"] = [self._attachment(name) for name in files]
        if not flags & EPHEMERAL:
            await self._gateway.dispatch("MESSAGE_CREATE", message)
        return SentMessage(int(message["id"]), channel.id, body, pings, tuple(files))

    def stored(self, channel: FakeChannel, raw_id: str) -> dict[str, Any]:
        message = self._world.messages.get(int(raw_id)) if raw_id.isdigit() else None
        if message is None or message["channel_id"] != str(channel.id):
            raise ApiError(404, 10008, "Unknown Message")
        return message

    async def edit(
        self, channel: FakeChannel, message: dict[str, Any], body: Mapping[str, Any]
    ) -> dict[str, Any]:
        if len(body.get("content") or "") > MAX_CONTENT:
            raise _too_long()
        for key in ("content", "embeds", "flags"):
            if key in body:
                message[key] = body[key]
        message["edited_timestamp"] = dt.datetime.now(dt.UTC).isoformat()
        self.edits.append(EditedMessage(int(message["id"]), channel.id, body))
        if not int(message.get("flags") or 0) & EPHEMERAL:
            await self._gateway.dispatch("MESSAGE_UPDATE", message)
        return message

    async def remove(self, channel: FakeChannel, message: Mapping[str, Any]) -> None:
        del self._world.messages[int(message["id"])]
        self.deleted.append(int(message["id"]))
        event = {"id": message["id"], "channel_id": str(channel.id)}
        if channel.guild_id is not None:
            event["guild_id"] = str(channel.guild_id)
        await self._gateway.dispatch("MESSAGE_DELETE", event)

    # ---- route handlers -----------------------------------------------------------------

    def _channel(self, request: web.Request) -> FakeChannel:
        try:
            return self._world.channel(int(request.match_info["cid"]))
        except (KeyError, ValueError):
            raise ApiError(404, 10003, "Unknown Channel") from None

    def _attachment(self, filename: str) -> dict[str, Any]:
        attachment_id = self._world.ids.next()
        url = f"{self._file_base()}/attachments/{attachment_id}/{filename}"
        return {"id": str(attachment_id), "filename": filename, "size": 0, "url": url, "proxy_url": url}

    async def _open_dm(self, request: web.Request) -> web.Response:
        user = self._world.users.get(int(request[BODY].get("recipient_id", 0)))
        if user is None:
            raise ApiError(400, 50033, "Invalid Recipient(s)")
        return json_response(self._world.dm_with(user).payload())

    async def _get_channel(self, request: web.Request) -> web.Response:
        return json_response(self._channel(request).payload())

    async def _create_message(self, request: web.Request) -> web.Response:
        channel, body = self._channel(request), request[BODY]
        nonce = str(body["nonce"]) if body.get("nonce") is not None else None
        if nonce is not None and len(nonce) > MAX_NONCE:
            raise invalid_form("nonce", "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_NONCE} or fewer in length.")
        # enforce_nonce (discord.py sets it on every send): a repeated nonce returns the
        # message already created instead of posting it twice — or 404 if it was deleted.
        # (Discord remembers nonces for "a few minutes"; the fake for its lifetime.)
        enforced = nonce is not None and bool(body.get("enforce_nonce"))
        if enforced and nonce in self._nonces:
            earlier = self._world.messages.get(self._nonces[nonce])
            if earlier is None:
                raise ApiError(404, 10008, "Unknown Message")
            return json_response(earlier)
        sent = await self.post(channel, body, request[FILES])
        if enforced:
            self._nonces[nonce] = sent.id
        self.sent.append(sent)
        return json_response(self._world.messages[sent.id])

    async def _get_message(self, request: web.Request) -> web.Response:
        return json_response(self.stored(self._channel(request), request.match_info["mid"]))

    async def _edit_message(self, request: web.Request) -> web.Response:
        channel = self._channel(request)
        message = self.stored(channel, request.match_info["mid"])
        if message["author"]["id"] != str(self._world.bot.id):
            raise ApiError(403, 50005, "Cannot edit a message authored by another user")
        return json_response(await self.edit(channel, message, request[BODY]))

    async def _delete_message(self, request: web.Request) -> web.Response:
        channel = self._channel(request)
        await self.remove(channel, self.stored(channel, request.match_info["mid"]))
        return web.Response(status=204)

    async def _typing(self, request: web.Request) -> web.Response:
        self.typing.append(self._channel(request).id)
        return web.Response(status=204)

    async def _thread_from_message(self, request: web.Request) -> web.Response:
        parent = self._channel(request)
        message = self.stored(parent, request.match_info["mid"])
        if int(message["id"]) in self._world.channels:
            raise ApiError(400, 160004, "A thread has already been created for this message")
        return await self._start_thread(parent, request[BODY], thread_id=int(message["id"]))

    async def _thread_without_message(self, request: web.Request) -> web.Response:
        return await self._start_thread(self._channel(request), request[BODY], thread_id=None)

    async def _start_thread(
        self, parent: FakeChannel, body: Mapping[str, Any], *, thread_id: int | None
    ) -> web.Response:
        if parent.type is not ChannelType.GUILD_TEXT:
            raise ApiError(400, 50024, "Cannot execute action on this channel type")
        name = body.get("name") or ""
        if not 1 <= len(name) <= 100:
            raise invalid_form("name", "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
        private = body.get("type") == int(ChannelType.PRIVATE_THREAD)
        thread = self._world.add_thread(parent, name, self._world.bot, thread_id=thread_id, private=private)
        await self._gateway.dispatch("THREAD_CREATE", {**thread.payload(), "newly_created": True})
        return json_response(thread.payload(), status=201)
