"""``mnemo users``, ``mnemo memory``, ``mnemo status`` and ``mnemo doctor`` on every
backend (issue 25 items 3, 5 and 6): the same data gives the same answers on SQLite
and PostgreSQL, a linked account's USER.md is its person's shared profile (shown and
edited there, with the account that keeps it named), and status/doctor speak for the
configured backend."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from mnemo.cli.doctor import Status, run_checks
from mnemo.cli.main import main
from mnemo.gateway.config import load_settings
from mnemo.gateway.storage import open_backend
from mnemo.memory.scope import UserRef
from mnemo.memory.sessions import NewMessage
from mnemo.memory.usage import Usage
from tests.conftest import BackendUnderTest

ANN, BEA, CY = UserRef("telegram", "7"), UserRef("telegram", "8"), UserRef("telegram", "9")


async def seed(home: Path) -> None:
    """telegram:7 has two DM sessions and spend, telegram:8 spend only, telegram:9 a USER.md."""
    backend = await open_backend(load_settings(home, environ={}))
    try:
        for title, cost in (("first", 0.25), ("second", 0.5)):
            row = await backend.sessions.create_session(
                chat_key="telegram:dm:7",
                platform="telegram",
                chat_id="7",
                thread_id=None,
                user_id="7",
                agent_context="primary",
                source="chat",
                model="m",
                system_prompt="(seed)",
                title=title,
            )
            await backend.sessions.append_messages(
                row.id, [NewMessage("user", f"{title} words", author_id="7"), NewMessage("assistant", "ok")]
            )
            await backend.sessions.add_usage(row.id, Usage(input_tokens=10, cost_usd=cost), payer=str(ANN))
            if title == "second":
                await backend.sessions.add_usage(row.id, Usage(input_tokens=90, cost_usd=1.5), payer=str(BEA))
        assert (await asyncio.to_thread(backend.files.user(CY).add, "Prefers green tea")).success
    finally:
        await backend.close()


async def mnemo(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The CLI as from a shell (its own event loop, in a thread): exit code, stdout, stderr."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["--home", str(home), *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_users_list_show_usage_and_links_answer_the_same_on_both_backends(
    home: Path, backend: BackendUnderTest, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed(home)
    code, out, _ = await mnemo(home, capsys, "users", "list", "--json")
    assert code == 0 and json.loads(out) == ["telegram:7", "telegram:8", "telegram:9"]
    code, out, _ = await mnemo(home, capsys, "users", "usage", "--json")
    assert [(r["user"], r["month_usd"]) for r in json.loads(out)] == [
        ("telegram:8", 1.5),
        ("telegram:7", 0.75),
    ]
    code, out, _ = await mnemo(home, capsys, "users", "show", "telegram:7", "--json")
    shown = json.loads(out)
    assert code == 0 and (shown["sessions"], shown["messages"], shown["spend"]["month_usd"]) == (2, 2, 0.75)
    code, out, _ = await mnemo(home, capsys, "users", "show", "telegram:404")
    assert code == 1 and "mnemo knows nothing of this person" in out

    code, out, _ = await mnemo(home, capsys, "users", "budget", "telegram:7", "--daily-usd", "3", "--json")
    assert code == 0 and json.loads(out)["own_limits"]["daily_usd"] == 3
    code, out, _ = await mnemo(home, capsys, "users", "link", "telegram:9", "telegram:7", "--json")
    assert code == 0 and json.loads(out)["canonical"] == "telegram:9"
    code, out, _ = await mnemo(home, capsys, "users", "show", "telegram:7")
    assert "profile: yes (kept under telegram:9)" in out and "linked: telegram:7, telegram:9 (profile)" in out
    code, out, _ = await mnemo(home, capsys, "users", "show", "telegram:9", "--json")
    shown = json.loads(out)
    assert shown["spend"]["month_usd"] == 0.75, "one payer for linked accounts"
    assert shown["own_limits"]["daily_usd"] == 3, "the joining side's caps follow the person"
    code, out, _ = await mnemo(home, capsys, "users", "unlink", "telegram:7", "--json")
    assert code == 0 and json.loads(out)["remaining"] == ["telegram:9"]
    code, out, _ = await mnemo(home, capsys, "users", "erase", "telegram:8", "--dry-run", "--json")
    receipt = json.loads(out)
    assert code == 0 and receipt["removed"]["usage"] == 1 and receipt["removed"]["sessions"] == 0
    assert receipt["not_erased"] == {}, "every layer erased on both backends, backups included"


async def test_memory_commands_act_on_a_linked_accounts_shared_profile(
    home: Path, backend: BackendUnderTest, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25 item 5: discord:9005 linked to telegram:4005 has no USER.md of its own."""
    assert (await mnemo(home, capsys, "users", "link", "telegram:4005", "discord:9005"))[0] == 0
    code, out, _ = await mnemo(
        home, capsys, "memory", "add", "--target", "user", "--user", "telegram:4005", "Likes tea"
    )
    assert code == 0 and json.loads(out)["success"]

    code, out, _ = await mnemo(home, capsys, "memory", "show", "--user", "discord:9005")
    assert code == 0 and "Likes tea" in out
    assert (
        "discord:9005 is linked: its USER.md is the shared profile of its person, kept under telegram:4005"
        in out
    )

    code, out, err = await mnemo(
        home, capsys, "memory", "add", "--target", "user", "--user", "discord:9005", "Has a cat"
    )
    assert code == 0 and json.loads(out)["success"] and "kept under telegram:4005" in err
    code, out, err = await mnemo(
        home, capsys, "memory", "remove", "--target", "user", "--user", "discord:9005", "tea"
    )
    assert code == 0 and json.loads(out)["success"]

    storage = await open_backend(load_settings(home, environ={}))
    try:
        assert storage.files.own(UserRef("telegram", "4005")).load().entries == ("Has a cat",)
        assert storage.files.own(UserRef("discord", "9005")).load().entries == ()
    finally:
        await storage.close()
    code, out, _ = await mnemo(home, capsys, "memory", "show", "--user", "telegram:4005")
    assert "Has a cat" in out and "is linked" not in out, "the keeper's own profile needs no note"


async def test_status_and_doctor_speak_for_the_configured_backend(
    home: Path, backend: BackendUnderTest, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed(home)
    code, out, _ = await mnemo(home, capsys, "status", "--json")
    report = json.loads(out)
    assert code == 1 and report == {"backend": backend.name, "running": False, "replicas": [], "dead": []}
    code, out, _ = await mnemo(home, capsys, "status")
    assert out.strip() == ("not running" if backend.name == "sqlite" else "0 live replicas on PostgreSQL")

    checks = {c.name: c for c in await run_checks(load_settings(home, environ={}), timeout_s=2)}
    database = checks["state.db" if backend.name == "sqlite" else "postgresql"]
    assert database.status is Status.PASS and "schema" in database.detail, database
    assert ("state.db" in checks) == (backend.name == "sqlite") and ("postgresql" in checks) != (
        "state.db" in checks
    )
    memories = checks["memories"]
    assert memories.status is (Status.PASS if backend.name == "sqlite" else Status.SKIP), memories


async def test_users_usage_shows_upkeep_apart_on_both_backends(
    home: Path, backend: BackendUnderTest, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed(home)
    opened = await open_backend(load_settings(home, environ={}))
    try:  # one background review of telegram:7's, already counted in their spend
        usage = Usage(input_tokens=5, cache_read_tokens=95, cost_usd=0.05)
        await opened.sessions.add_usage(
            (await opened.sessions.list_sessions("telegram:dm:7"))[0].id, usage, payer=str(ANN)
        )
        await opened.budgets.record_upkeep("s", "review", str(ANN), usage)
    finally:
        await opened.close()
    code, out, _ = await mnemo(home, capsys, "users", "usage", "--json")
    rows = {r["user"]: r for r in json.loads(out)}
    assert code == 0 and rows["telegram:7"]["month_usd"] == pytest.approx(0.8)
    assert rows["telegram:7"]["upkeep_month_usd"] == pytest.approx(0.05)
    assert rows["telegram:7"]["upkeep_day_tokens"] == 100
    assert rows["telegram:8"]["upkeep_day_usd"] == 0
    code, out, _ = await mnemo(home, capsys, "users", "usage")
    assert "upkeep $0.0500, 100 tokens" in out and "(upkeep $0.0500)" in out
