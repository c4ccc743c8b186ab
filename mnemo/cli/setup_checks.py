"""What ``mnemo setup`` checks before it saves anything, one request each.

* the model key: the doctor's LLM check (``GET /v1/models``, free; a compatible
  endpoint without it gets a one-token message);
* a Telegram token: ``getMe`` — the bot's name is shown back; then, to let you in,
  ``getUpdates`` waits for the message you send the bot from your own account (the
  bot is not running yet, so nothing else reads its updates);
* a Discord token: ``GET /users/@me``, and the application's flags for the Message
  Content intent, which the adapter needs (off, the bot would read empty messages).

Plain HTTP with a short timeout and no platform SDK, like ``mnemo doctor``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mnemo.cli.doctor import DISCORD_API, Status, check_llm
from mnemo.gateway.config import Settings

if TYPE_CHECKING:  # aiohttp is imported when a check runs: the CLI's --help stays quick
    import aiohttp

TIMEOUT_S = 10.0
# Application flags: the Message Content intent, for verified (1 << 18) and
# unverified (1 << 19, "limited") bots.
MESSAGE_CONTENT_FLAGS = (1 << 18) | (1 << 19)


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    detail: str
    name: str = ""  # the bot's @username / name when the check found it


@dataclass(frozen=True, slots=True)
class Sender:
    """Who sent the bot a message while the wizard waited."""

    user_id: str
    name: str


def _http(timeout_s: float = TIMEOUT_S) -> aiohttp.ClientSession:
    import aiohttp

    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))


def _network_errors() -> tuple[type[Exception], ...]:
    import aiohttp

    return (aiohttp.ClientError, TimeoutError)


async def _json(resp: aiohttp.ClientResponse) -> Any:
    try:
        return await resp.json(content_type=None)
    except ValueError:
        return None


async def model(settings: Settings) -> Verdict:
    try:
        async with _http() as http:
            check = await check_llm(settings, http)
    except _network_errors() as e:
        return Verdict(False, f"unreachable: {e or type(e).__name__}")
    return Verdict(check.status is Status.PASS, check.detail)


def _telegram_url(base: str, token: str, method: str) -> str:
    return f"{base.rstrip('/')}/bot{token}/{method}"


async def telegram(base: str, token: str) -> Verdict:
    try:
        async with _http() as http, http.get(_telegram_url(base, token, "getMe")) as resp:
            body = await _json(resp)
    except _network_errors() as e:
        return Verdict(False, f"{base} unreachable: {e or type(e).__name__}")
    if resp.status == 200 and isinstance(body, dict) and isinstance(body.get("result"), dict):
        me = body["result"]
        return Verdict(
            True, f"@{me.get('username')} ({me.get('first_name', '')})", str(me.get("username", ""))
        )
    if resp.status in (401, 404):
        return Verdict(False, "Telegram refused the token (check it with @BotFather)")
    return Verdict(False, f"HTTP {resp.status} from {base}")


async def first_sender(base: str, token: str, wait_s: float) -> Sender | None:
    """The first person to send the bot a private message within ``wait_s``, or None.
    Their update is confirmed, so the bot does not answer it later."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    url = _telegram_url(base, token, "getUpdates")
    offset = 0
    found: Sender | None = None
    async with _http(wait_s + 15) as http:
        while found is None and (left := deadline - loop.time()) > 0:
            params = {"timeout": str(max(1, int(left))), "offset": str(offset)}
            async with http.get(url, params=params) as resp:
                body = await _json(resp)
            if resp.status != 200 or not isinstance(body, dict):
                return None  # a webhook is set, or another poller: nothing to wait for
            for update in body.get("result") or ():
                offset = max(offset, int(update.get("update_id", 0)) + 1)
                found = found or _private_sender(update.get("message") or {})
        if offset:
            async with http.get(url, params={"offset": str(offset), "timeout": "0"}):
                pass  # confirms what was read
    return found


def _private_sender(message: dict[str, Any]) -> Sender | None:
    sender, chat = message.get("from") or {}, message.get("chat") or {}
    if chat.get("type") != "private" or sender.get("id") is None:
        return None
    name = " ".join(str(sender[k]) for k in ("first_name", "last_name") if sender.get(k))
    return Sender(str(sender["id"]), name or str(sender.get("username") or ""))


async def discord(base: str | None, token: str) -> Verdict:
    root = (base or DISCORD_API).rstrip("/")
    headers = {"Authorization": f"Bot {token}"}
    try:
        async with _http() as http:
            async with http.get(f"{root}/users/@me", headers=headers) as resp:
                me = await _json(resp)
            if resp.status != 200 or not isinstance(me, dict):
                return Verdict(False, f"Discord refused the token (HTTP {resp.status})")
            async with http.get(f"{root}/oauth2/applications/@me", headers=headers) as resp:
                app = await _json(resp)
    except _network_errors() as e:
        return Verdict(False, f"{root} unreachable: {e or type(e).__name__}")
    name = str(me.get("username", ""))
    flags = int(app.get("flags") or 0) if isinstance(app, dict) else 0
    if not flags & MESSAGE_CONTENT_FLAGS:
        return Verdict(
            False,
            f"{name}: the Message Content intent is off — switch it on in the developer portal "
            "(your application → Bot → Privileged Gateway Intents), then run setup again",
            name,
        )
    return Verdict(True, f"{name} (id {me.get('id')}), Message Content intent on", name)
