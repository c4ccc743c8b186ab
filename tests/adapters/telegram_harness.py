"""The whole bot against local fakes: the real PTB ``Application`` inside ``TelegramAdapter``
talking to ``FakeTelegram``, the real anthropic SDK talking to the emulator, and the
gateway built by ``open_app``.

    async with rig.app() as (app, adapter):
        rig.fake.push_text(CHAT, USER, "hello")
        [reply] = await rig.fake.wait_for_sent(1)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnemo.adapters.telegram import TelegramAdapter
from mnemo.app import App, open_app
from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.emulator import Emulator, RecordedRequest
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.webserver import WebServer
from tests.fakes.telegram_api import ApiError, FakeTelegram
from tests.support.ports import reserve_port


class FlakyTelegram(FakeTelegram):
    """``FakeTelegram`` whose sendMessage a test can break: all of them while
    ``sends_down`` is set, or exactly the n-th ones (1-based) in ``fail_sends``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sends_down = False
        self.fail_sends: set[int] = set()
        self._send_number = 0

    async def _api_sendMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        self._send_number += 1
        if self.sends_down or self._send_number in self.fail_sends:
            raise ApiError(502, "Bad Gateway")
        return await super()._api_sendMessage(params)


def free_port() -> int:
    """A port to name before its server listens; no other parallel test gets it."""
    return reserve_port()


def user_texts(request: RecordedRequest) -> list[str]:
    """The text of every user turn of a recorded Messages API request (tool results skipped)."""
    out = []
    for message in request.messages:
        if message["role"] != "user":
            continue
        content = message["content"]
        if isinstance(content, str):
            out.append(content)
            continue
        texts = [b["text"] for b in content if b.get("type") == "text"]
        if texts:
            out.append("\n".join(texts))
    return out


def last_user_text(request: RecordedRequest) -> str:
    texts = user_texts(request)
    return texts[-1] if texts else ""


async def wait_until(ready: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    async with asyncio.timeout(timeout):
        while not ready():
            await asyncio.sleep(0.02)


@dataclass
class TelegramRig:
    fake: FakeTelegram
    emulator: Emulator
    home: Path

    def settings(self, **overrides: Any) -> Settings:
        base: dict[str, Any] = {
            "telegram.bot_token": self.fake.token,
            "telegram.api_base_url": self.fake.root,
            "llm.base_url": self.emulator.base_url,
            "llm.api_key": "test-key",
            "access.allowed": ("telegram:*",),
            "access.rate_limit_per_minute": 0,
            "gateway.debounce_s": 0.0,
            "llm.max_retries": 2,
            "llm.retry_after_cap_s": 0.05,
            "web.port": 0,
        }
        base.update(overrides)
        return load_settings(self.home, environ={}, overrides=base)

    def adapter(self, settings: Settings, *, web: WebServer | None = None, **kwargs: Any) -> TelegramAdapter:
        options: dict[str, Any] = {"poll_timeout_s": 5.0, "reconnect_backoff_s": (0.05, 0.2)}
        options.update(kwargs)
        return TelegramAdapter(settings.telegram, web=web, **options)

    @asynccontextmanager
    async def app(
        self, *, webhook: bool = False, adapter_options: dict[str, Any] | None = None, **overrides: Any
    ) -> AsyncIterator[tuple[App, TelegramAdapter]]:
        """The running bot; ``webhook=True`` serves updates on a local web server (the
        webhook URL points at it) instead of polling."""
        web = None
        if webhook:
            port = free_port()
            overrides = {
                "web.port": port,
                "telegram.webhook_url": f"http://127.0.0.1:{port}/telegram/updates",
                "telegram.webhook_secret": "hook_secret-0123456789",
                **overrides,
            }
        settings = self.settings(**overrides)
        if webhook:
            web = WebServer(settings.web, Metrics())
        adapter = self.adapter(settings, web=web, **(adapter_options or {}))
        async with open_app(
            settings,
            adapters=[adapter],
            web=web,
            llm_base_url=self.emulator.base_url,
            api_key="test-key",
            trial=False,
        ) as app:
            yield app, adapter
