"""The first web chat on a fresh machine (local trial mode, as ``mnemo run`` wires it):
the scripted model shows what mnemo does — what it was told to remember in this
session is what it says it knows, and every reply stays labelled as scripted."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from mnemo.adapters.web import WebAdapter
from mnemo.app import open_app
from mnemo.gateway.emulator import TRIAL_LABEL
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.webserver import WebServer
from tests.support.webchat import ChatClient, web_settings


async def test_remember_then_ask_over_the_trial_web_chat_answers_with_the_fact(
    home: Path, http: aiohttp.ClientSession
) -> None:
    settings = web_settings(home)
    assert settings.trial_mode
    server = WebServer(settings.web, Metrics())
    adapter = WebAdapter(server, trial=True, uploads_dir=home / "media" / "uploads")
    async with open_app(settings, adapters=[adapter], web=server) as app:
        assert app.trial
        chat = await ChatClient.connect(http, server.url, "ada-0123456789")
        await chat.say("remember that I like green tea")
        saved = (await chat.next("reply"))["text"]
        await chat.say("what do you know about me?")
        answer = (await chat.next("reply"))["text"]
    assert saved.startswith(TRIAL_LABEL) and "green tea" in saved
    assert answer.startswith(TRIAL_LABEL)
    assert "green tea" in answer, answer
    assert "nothing saved" not in answer
