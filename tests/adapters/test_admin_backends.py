"""The dashboard tells the truth on every backend (issue 25 items 3 and 5): its Users
page lists the same people as ``mnemo users list --json`` with the spend of ``mnemo
users usage --json``, its Overview shows today's cost and messages as the CLI counts
them, and a linked account's page edits its person's shared USER.md and says which
account keeps it — on SQLite and on PostgreSQL alike."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mnemo.adapters.admin.pages import usd
from mnemo.cli.main import main
from mnemo.gateway.emulator import Emulator
from mnemo.memory.scope import UserRef
from mnemo.memory.sessions import NewMessage
from mnemo.memory.usage import Usage
from tests.conftest import BackendUnderTest
from tests.support.admin_seed import ADMIN_TOKEN, CSRF
from tests.support.webchat import open_web_app, web_settings

ALICE, LAPTOP = UserRef("telegram", "1001"), UserRef("web", "alice-laptop")
BOB, CAROL, DAVE = UserRef("discord", "2002"), UserRef("web", "carol"), UserRef("telegram", "3003")
ROW = re.compile(r"<tr>(.*?)</tr>", re.S)
CELL = re.compile(r"<td>(.*?)</td>", re.S)
TAG = re.compile(r"<[^>]+>")


def text(cell: str) -> str:
    return html.unescape(TAG.sub("", cell)).strip()


def table_rows(page: str) -> list[list[str]]:
    return [[text(c) for c in CELL.findall(row)] for row in ROW.findall(page) if "<td>" in row]


def people_rows(page: str) -> dict[str, list[str]]:
    """The Users page: person → (USER.md, spend today, of it upkeep, spend this month)."""
    return {row[0].removesuffix(" admin"): row[1:] for row in table_rows(page)}


def tile(page: str, label: str) -> str:
    match = re.search(
        rf'<div class="label">{re.escape(html.escape(label))}</div><div class="value">(.*?)</div>', page
    )
    assert match is not None, label
    return text(match.group(1))


async def chat(app: Any, user: UserRef, words: list[str], cost: float, payer: UserRef | None = None) -> None:
    row = await app.store.create_session(
        chat_key=f"{user.platform}:dm:{user.user_id}",
        platform=user.platform,
        chat_id=user.user_id,
        thread_id=None,
        user_id=user.user_id,
        agent_context="primary",
        source="chat",
        model="m",
        system_prompt="(seed)",
    )
    turns = [
        NewMessage("user", w, author_id=user.user_id) if i % 2 == 0 else NewMessage("assistant", w)
        for i, w in enumerate(words)
    ]
    await app.store.append_messages(row.id, turns)
    await app.store.add_usage(
        row.id, Usage(input_tokens=100, output_tokens=10, cost_usd=cost), payer=str(payer or user)
    )


@pytest.fixture
async def dash(home: Path, emulator: Emulator, backend: BackendUnderTest) -> AsyncIterator[Any]:
    settings = web_settings(home, **{"web.admin_token": ADMIN_TOKEN})
    assert settings.database.is_postgresql == (backend.url is not None)
    async with open_web_app(settings, emulator.base_url) as app:
        await chat(app, ALICE, ["Which museum?", "The Confluences.", "Book trams."], 0.42)
        await chat(app, BOB, ["Which tomatoes?", "San Marzano."], 0.05)
        await chat(app, BOB, ["And for Dave?"], 0.3, payer=DAVE)  # spend, but no session of his own
        for who, entry in ((ALICE, "Alice lives in Lyon."), (CAROL, "Carol has a profile only.")):
            assert (await asyncio.to_thread(app.files.user(who).add, entry)).success
        assert app.links is not None
        await app.links.link(ALICE, LAPTOP)
        yield app


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        yield session


async def sign_in(client: aiohttp.ClientSession, base: str) -> str:
    async with client.post(f"{base}/admin/signin", data={"token": ADMIN_TOKEN}) as r:
        assert r.status == 200
        match = CSRF.search(await r.text())
    assert match is not None
    return match.group(1)


async def page(client: aiohttp.ClientSession, url: str) -> str:
    async with client.get(url) as r:
        assert r.status == 200, url
        return await r.text()


async def cli(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """A command's stdout, run as from a shell (its own event loop, in a thread)."""
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--home", str(home), *argv]) == 0
    return capsys.readouterr().out


async def test_users_and_overview_show_what_the_cli_shows(
    dash: Any, client: aiohttp.ClientSession, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = dash.web.url
    await sign_in(client, base)
    users = people_rows(await page(client, f"{base}/admin/users"))
    overview = await page(client, f"{base}/admin")

    people = json.loads(await cli(home, capsys, "users", "list", "--json"))
    assert people == sorted(map(str, (ALICE, BOB, CAROL, DAVE)))
    assert list(users) == people
    spend = {r["user"]: r for r in json.loads(await cli(home, capsys, "users", "usage", "--json"))}
    for person, (profile, today, upkeep, month) in users.items():
        assert today == usd(spend[person]["day_usd"] if person in spend else 0.0), person
        assert upkeep == usd(spend[person]["upkeep_day_usd"] if person in spend else 0.0), person
        assert month == usd(spend[person]["month_usd"] if person in spend else 0.0), person
        assert profile.startswith("yes") == (person in (str(ALICE), str(CAROL))), person
    assert tile(overview, "Today's cost") == usd(sum(r["day_usd"] for r in spend.values())) == "$0.7700"
    listed = await cli(home, capsys, "sessions", "list", "--json", "--limit", "100")
    sessions = [json.loads(line) for line in listed.splitlines()]
    assert tile(overview, "Today's messages") == str(sum(s["message_count"] for s in sessions)) == "6"


async def test_a_linked_accounts_page_edits_the_shared_profile_and_names_its_keeper(
    dash: Any, client: aiohttp.ClientSession, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = dash.web.url
    csrf = await sign_in(client, base)
    laptop = await page(client, f"{base}/admin/users/{LAPTOP}")
    assert "Alice lives in Lyon." in laptop, "the person's profile, not the account's own empty one"
    assert f"kept under {ALICE}" in html.unescape(TAG.sub("", laptop))
    form = {
        "csrf": csrf,
        "target": "user",
        "user": str(LAPTOP),
        "action": "add",
        "content": "Alice has a laptop.",
    }
    async with client.post(f"{base}/admin/memory", data=form) as r:
        assert r.status == 200 and "Alice has a laptop." in await r.text()
    entries = (await asyncio.to_thread(dash.files.own(ALICE).load)).entries
    assert entries == ("Alice lives in Lyon.", "Alice has a laptop.")
    assert (await asyncio.to_thread(dash.files.own(LAPTOP).load)).entries == ()
    users = {
        row[0].removesuffix(" admin").strip(): row[1]
        for row in table_rows(await page(client, f"{base}/admin/users"))
    }
    assert users[str(ALICE)] == "yes"


async def test_admins_accept_and_reject_memory_proposals_in_the_dashboard(
    dash: Any, client: aiohttp.ClientSession
) -> None:
    from mnemo.memory.journal import Actor, Layer, NewEntry, Provenance, Trust

    base = dash.web.url
    csrf = await sign_in(client, base)
    owner = dash.files.user(ALICE).owner
    by = Provenance(Actor.job("consolidation"), Trust.PROPOSED, speaker=owner)
    proposals = dash.consolidation.proposals  # the backend's ProposalRepository
    fix = await proposals.propose(
        NewEntry(
            Layer.CURATED, owner, "replace", "Alice lives in Lyon.", "Alice lives in Lyon (Croix-Rousse).", by
        )
    )
    drop = await proposals.propose(
        NewEntry(Layer.CURATED, owner, "remove", "Alice lives in Lyon.", None, by, note="duplicate")
    )
    shown = await page(client, f"{base}/admin/memory/proposals")
    assert f"#{fix}" in shown and f"#{drop}" in shown and "duplicate" in shown
    assert (await asyncio.to_thread(dash.files.user(ALICE).load)).entries == ("Alice lives in Lyon.",)

    async with client.post(
        f"{base}/admin/memory/proposals", data={"entry": str(fix), "decision": "accept", "csrf": csrf}
    ) as r:
        assert r.status == 200 and f"#{fix} accepted" in await r.text()
    async with client.post(
        f"{base}/admin/memory/proposals", data={"entry": str(drop), "decision": "reject", "csrf": csrf}
    ) as r:
        assert r.status == 200 and f"#{drop} rejected" in await r.text()
    async with client.post(
        f"{base}/admin/memory/proposals", data={"entry": str(drop), "decision": "accept"}
    ) as r:
        assert r.status == 403, "the CSRF token is required"
    assert (await asyncio.to_thread(dash.files.user(ALICE).load)).entries == (
        "Alice lives in Lyon (Croix-Rousse).",
    )
    assert [e.id for e in await proposals.rejected([owner])] == [drop]
    assert "Nothing waits for a decision." in await page(client, f"{base}/admin/memory/proposals")
