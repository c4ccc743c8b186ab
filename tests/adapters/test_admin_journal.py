"""The dashboard's memory history: every write with its provenance and a link to the
message it came from, a person's policy beside their history, and revert through the
same write path (journaled as the admin's)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mnemo.gateway.emulator import Emulator
from mnemo.memory.journal import Actor, JournalQuery, Provenance, Trust
from tests.adapters.test_admin_dashboard import sign_in, text_of
from tests.support.admin_seed import ADMIN_TOKEN, ALICE, seed
from tests.support.webchat import open_web_app, web_settings


@pytest.fixture
async def dash(home: Path, emulator: Emulator) -> AsyncIterator[tuple[Any, dict[str, Any]]]:
    settings = web_settings(home, **{"web.admin_token": ADMIN_TOKEN})
    async with open_web_app(settings, emulator.base_url) as app:
        yield app, await seed(app)


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        yield session


async def test_the_history_shows_provenance_links_the_message_and_reverts(
    dash: tuple[Any, dict[str, Any]],
    client: aiohttp.ClientSession,
) -> None:
    app, ids = dash
    base = app.web.url
    said = Provenance(
        Actor.MODEL, Trust.INFERRED, speaker=str(ALICE), session=ids["alice_session"], message="77"
    )
    await asyncio.to_thread(app.files.user(ALICE).add, "Alice likes ferries.", said)
    csrf = await sign_in(client, base)
    async with client.post(
        f"{base}/admin/memory",
        data={
            "target": "user",
            "user": str(ALICE),
            "action": "add",
            "content": "Alice likes trams.",
            "csrf": csrf,
        },
    ) as r:
        assert r.status == 200
    page = await text_of(client, f"{base}/admin/memory/history?user={ALICE}")
    assert "Alice likes ferries." in page and "Alice likes trams." in page
    assert f'href="/admin/sessions/{ids["alice_session"]}#p-77"' in page, "a link to the message"
    assert "inferred" in page and "admin" in page
    assert "Memory policy: remember <strong>on (default)</strong>" in page

    [admin_write] = [e for e in await app.journal.history(JournalQuery()) if e.new == "Alice likes trams."]
    assert (admin_write.actor, admin_write.trust) == ("admin", "admin")
    async with client.post(
        f"{base}/admin/memory/revert",
        data={"entry": str(admin_write.id), "back": f"/admin/memory/history?user={ALICE}", "csrf": csrf},
    ) as r:
        assert r.status == 200
        after = await r.text()
    assert f"Undone #{admin_write.id}" in after
    assert "Alice likes trams." not in (await asyncio.to_thread(app.files.user(ALICE).load)).entries
    [revert] = await app.journal.history(JournalQuery(limit=1))
    assert (revert.reverts, revert.actor) == (admin_write.id, "admin")
    assert re.search(r"undone", await text_of(client, f"{base}/admin/memory/history"))


async def test_a_revert_needs_the_csrf_token(
    dash: tuple[Any, dict[str, Any]],
    client: aiohttp.ClientSession,
) -> None:
    app, _ = dash
    await sign_in(client, app.web.url)
    async with client.post(
        f"{app.web.url}/admin/memory/revert", data={"entry": "1"}, allow_redirects=False
    ) as r:
        assert r.status == 403
