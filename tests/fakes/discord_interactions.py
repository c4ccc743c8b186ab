"""The fake Discord's application commands and interactions.

- ``PUT /applications/{app}/commands`` (and ``/guilds/{g}/commands``) is a bulk
  overwrite, as ``CommandTree.sync()`` uses it: names are checked (lower-case
  ``[-_a-z0-9]{1,32}`` — Discord also allows other scripts' letters), descriptions must
  be 1-100 chars, duplicates are refused with 50035, and a re-synced name keeps its id.
- ``push`` sends INTERACTION_CREATE for a registered command only (Discord never
  delivers an unregistered one), with a fresh id and token.
- ``POST /interactions/{id}/{token}/callback`` records the response; a second one is
  400 / 40060. discord.py 2.7 asks ``?with_response=1`` and reads the callback object
  (``interaction.response_message_ephemeral`` etc.). Type 4 posts the reply message
  (not echoed over the gateway when ephemeral, flag 64); type 5 defers it, and the
  first ``PATCH .../messages/@original`` posts it.
- Followups (``POST /webhooks/{app}/{token}``) need an acknowledged interaction, else
  404 / 10015 "Unknown Webhook", like Discord.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.discord_gateway import FakeGateway
from tests.fakes.discord_http import BODY, FILES, ApiError, json_response
from tests.fakes.discord_messages import EPHEMERAL, EditedMessage, MessageDesk, SentMessage
from tests.fakes.discord_world import BOT_PERMISSIONS, DiscordWorld, FakeChannel, FakeUser

_COMMAND_NAME = re.compile(r"^[-_a-z0-9]{1,32}$")


@dataclass(frozen=True)
class InteractionResponse:
    """A recorded interaction callback (type 4 = message, 5 = deferred, ...)."""

    interaction_id: int
    type: int
    data: Mapping[str, Any]

    @property
    def content(self) -> str:
        return self.data.get("content") or ""

    @property
    def flags(self) -> int:
        return int(self.data.get("flags") or 0)

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & EPHEMERAL)


@dataclass(frozen=True)
class PushedInteraction:
    id: int
    token: str
    channel_id: int


@dataclass
class _Interaction:
    pushed: PushedInteraction
    acknowledged: bool = False
    deferred_flags: int = 0
    original_message_id: int | None = None


class InteractionDesk:
    """Records ``commands`` (scope -> list; None is global, else a guild id),
    ``interaction_responses`` and ``followups``."""

    def __init__(self, world: DiscordWorld, gateway: FakeGateway, messages: MessageDesk) -> None:
        self._world = world
        self._gateway = gateway
        self._messages = messages
        self._interactions: dict[int, _Interaction] = {}
        self.commands: dict[int | None, list[dict[str, Any]]] = {}
        self.interaction_responses: list[InteractionResponse] = []
        self.followups: list[SentMessage] = []

    def add_routes(self, router: web.UrlDispatcher, prefix: str) -> None:
        p = prefix
        for scope in ("/applications/{app}/commands", "/applications/{app}/guilds/{gid}/commands"):
            router.add_get(p + scope, self._get_commands)
            router.add_put(p + scope, self._put_commands)
        router.add_post(p + "/interactions/{iid}/{token}/callback", self._callback)
        router.add_post(p + "/webhooks/{app}/{token}", self._followup)
        router.add_get(p + "/webhooks/{app}/{token}/messages/{mid}", self._get_webhook_message)
        router.add_patch(p + "/webhooks/{app}/{token}/messages/{mid}", self._edit_webhook_message)
        router.add_delete(p + "/webhooks/{app}/{token}/messages/{mid}", self._delete_webhook_message)

    async def push(
        self,
        name: str,
        user: FakeUser,
        channel: FakeChannel,
        options: Mapping[str, str | int | float | bool],
    ) -> PushedInteraction:
        command = self._find_command(name, channel.guild_id)
        pushed = PushedInteraction(self._world.ids.next(), secrets.token_urlsafe(32), channel.id)
        self._interactions[pushed.id] = _Interaction(pushed)
        payload = _interaction_payload(
            self._world,
            interaction_id=pushed.id,
            token=pushed.token,
            command=command,
            user=user,
            channel=channel,
            options=_option_payloads(options),
        )
        await self._gateway.dispatch("INTERACTION_CREATE", payload)
        return pushed

    def _find_command(self, name: str, guild_id: int | None) -> dict[str, Any]:
        scopes = (None,) if guild_id is None else (guild_id, None)
        for scope in scopes:
            for command in self.commands.get(scope, []):
                if command["name"] == name:
                    return command
        raise LookupError(f"/{name} is not registered with the fake (sync the command tree first)")

    # ---- application commands -----------------------------------------------------------

    def _scope(self, request: web.Request) -> int | None:
        gid = request.match_info.get("gid")
        if request.match_info["app"] != str(self._world.application_id) or (
            gid is not None and (not gid.isdigit() or int(gid) not in self._world.guilds)
        ):
            raise ApiError(403, 50001, "Missing Access")
        return None if gid is None else int(gid)

    async def _get_commands(self, request: web.Request) -> web.Response:
        return json_response(self.commands.get(self._scope(request), []))

    async def _put_commands(self, request: web.Request) -> web.Response:
        scope = self._scope(request)
        previous = {c["name"]: c for c in self.commands.get(scope, [])}
        stored: list[dict[str, Any]] = []
        for index, command in enumerate(request[BODY]):
            _validate_command(index, command, {c["name"] for c in stored})
            old = previous.get(command["name"])
            record = {
                "type": 1,
                "options": [],
                "default_member_permissions": None,
                "nsfw": False,
                **command,
                "id": old["id"] if old else str(self._world.ids.next()),
                "application_id": str(self._world.application_id),
                "version": str(self._world.ids.next()),
            }
            if scope is not None:
                record["guild_id"] = str(scope)
            stored.append(record)
        self.commands[scope] = stored
        return json_response(stored)

    # ---- interaction callbacks and their webhook ----------------------------------------

    def _by_id(self, request: web.Request) -> _Interaction:
        raw = request.match_info["iid"]
        found = self._interactions.get(int(raw)) if raw.isdigit() else None
        if found is None or found.pushed.token != request.match_info["token"]:
            raise ApiError(404, 10062, "Unknown interaction")
        return found

    def _by_webhook(self, request: web.Request) -> _Interaction:
        if request.match_info["app"] == str(self._world.application_id):
            for found in self._interactions.values():
                if found.pushed.token == request.match_info["token"] and found.acknowledged:
                    return found
        raise ApiError(404, 10015, "Unknown Webhook")

    async def _callback(self, request: web.Request) -> web.Response:
        found = self._by_id(request)
        if found.acknowledged:
            raise ApiError(400, 40060, "Interaction has already been acknowledged.")
        kind = int(request[BODY]["type"])
        data = request[BODY].get("data") or {}
        message = None
        if kind == 4:  # CHANNEL_MESSAGE_WITH_SOURCE
            channel = self._world.channel(found.pushed.channel_id)
            sent = await self._messages.post(channel, data, request[FILES], webhook=True)
            found.original_message_id = sent.id
            message = self._world.messages[sent.id]
        elif kind == 5:  # DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE ("is thinking...")
            found.deferred_flags = int(data.get("flags") or 0)
        found.acknowledged = True
        self.interaction_responses.append(InteractionResponse(found.pushed.id, kind, data))
        if "with_response" not in request.query:
            return web.Response(status=204)
        flags = int((message or data).get("flags") or 0) | found.deferred_flags
        result: dict[str, Any] = {
            "interaction": {
                "id": str(found.pushed.id),
                "type": 2,
                "response_message_id": message["id"] if message else None,
                "response_message_loading": kind == 5,
                "response_message_ephemeral": bool(flags & EPHEMERAL),
            }
        }
        if message is not None:
            result["resource"] = {"type": kind, "message": message}
        return json_response(result)

    async def _followup(self, request: web.Request) -> web.Response:
        found = self._by_webhook(request)
        channel = self._world.channel(found.pushed.channel_id)
        sent = await self._messages.post(channel, request[BODY], request[FILES], webhook=True)
        self.followups.append(sent)
        if request.query.get("wait", "").lower() in ("true", "1"):
            return json_response(self._world.messages[sent.id])
        return web.Response(status=204)

    def _webhook_message(self, request: web.Request) -> tuple[FakeChannel, dict[str, Any]]:
        found = self._by_webhook(request)
        channel = self._world.channel(found.pushed.channel_id)
        mid = request.match_info["mid"]
        if mid == "@original":
            if found.original_message_id is None:
                raise ApiError(404, 10008, "Unknown Message")
            mid = str(found.original_message_id)
        return channel, self._messages.stored(channel, mid)

    async def _get_webhook_message(self, request: web.Request) -> web.Response:
        return json_response(self._webhook_message(request)[1])

    async def _edit_webhook_message(self, request: web.Request) -> web.Response:
        found = self._by_webhook(request)
        if request.match_info["mid"] == "@original" and found.original_message_id is None:
            # Editing the original of a deferred response is what posts it.
            channel = self._world.channel(found.pushed.channel_id)
            body = {**request[BODY], "flags": found.deferred_flags}
            sent = await self._messages.post(channel, body, request[FILES], webhook=True)
            found.original_message_id = sent.id
            self._messages.edits.append(EditedMessage(sent.id, channel.id, request[BODY]))
            return json_response(self._world.messages[sent.id])
        channel, message = self._webhook_message(request)
        return json_response(await self._messages.edit(channel, message, request[BODY]))

    async def _delete_webhook_message(self, request: web.Request) -> web.Response:
        channel, message = self._webhook_message(request)
        await self._messages.remove(channel, message)
        return web.Response(status=204)


def _validate_command(index: int, command: Mapping[str, Any], seen: set[str]) -> None:
    def invalid(field: str, code: str, message: str) -> ApiError:
        errors = {str(index): {field: {"_errors": [{"code": code, "message": message}]}}}
        return ApiError(400, 50035, "Invalid Form Body", errors)

    name = command.get("name", "")
    chat_input = command.get("type", 1) == 1
    if chat_input and not _COMMAND_NAME.match(name):
        raise invalid("name", "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid")
    if name in seen:
        raise invalid(
            "name", "APPLICATION_COMMANDS_DUPLICATE_NAME", "Application command names must be unique"
        )
    if chat_input and not 1 <= len(command.get("description", "")) <= 100:
        raise invalid("description", "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")


def _interaction_payload(
    world: DiscordWorld,
    *,
    interaction_id: int,
    token: str,
    command: Mapping[str, Any],
    user: FakeUser,
    channel: FakeChannel,
    options: list[dict[str, Any]],
) -> dict[str, Any]:
    """INTERACTION_CREATE for a slash command (type 2, APPLICATION_COMMAND)."""
    guild = world.guild_of(channel)
    data: dict[str, Any] = {
        "id": command["id"],
        "name": command["name"],
        "type": 1,
        "options": options,
    }
    if "guild_id" in command:
        data["guild_id"] = command["guild_id"]
    payload: dict[str, Any] = {
        "id": str(interaction_id),
        "application_id": str(world.application_id),
        "type": 2,
        "data": data,
        "channel": channel.payload(),
        "channel_id": str(channel.id),
        "token": token,
        "version": 1,
        "app_permissions": str(BOT_PERMISSIONS),
        "locale": "en-US",
        "entitlements": [],
        "attachment_size_limit": 10 * 1024 * 1024,
    }
    if guild is None:
        payload["user"] = user.payload()
        payload["context"] = 1  # BOT_DM
        payload["authorizing_integration_owners"] = {"0": str(user.id)}
    else:
        member = guild.member_payload(user)
        member["permissions"] = str(BOT_PERMISSIONS)
        payload["member"] = member
        payload["guild_id"] = str(guild.id)
        payload["guild"] = {"id": str(guild.id), "locale": "en-US", "features": []}
        payload["guild_locale"] = "en-US"
        payload["context"] = 0  # GUILD
        payload["authorizing_integration_owners"] = {"0": str(guild.id)}
    return payload


def _option_payloads(options: Mapping[str, str | int | float | bool]) -> list[dict[str, Any]]:
    """Slash-command option values with Discord's option types (3 string, 4 integer,
    5 boolean, 10 number); bool is tested before int because bool is an int."""
    out = []
    for name, value in options.items():
        if isinstance(value, bool):
            kind = 5
        elif isinstance(value, int):
            kind = 4
        elif isinstance(value, float):
            kind = 10
        else:
            kind = 3
        out.append({"name": name, "type": kind, "value": value})
    return out
