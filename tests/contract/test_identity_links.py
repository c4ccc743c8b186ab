"""IdentityLinks on every backend (``gateway/people/links.py`` on state.db,
``gateway/storage_pg/links.py`` on PostgreSQL): codes used once and expiring, linking
merging people and their profiles, unlinking splitting them, another process's change
seen at the next refresh, and the person's DMs on their other accounts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mnemo.gateway.people.links import CODE_TTL_S, IdentityLinks, Redeemed
from mnemo.gateway.storage import state_database
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.identity import Identities
from mnemo.memory.scope import UserRef

A, B, C = UserRef("telegram", "1"), UserRef("discord", "2"), UserRef("web", "3")


@dataclass
class Clock:
    now: float = 2_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    links: IdentityLinks
    clock: Clock
    files: MemoryFiles
    another: Callable[[], IdentityLinks]  # a second process on the same database
    sessions: Any


@pytest.fixture(params=["sqlite", "postgresql"])
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    clock = Clock()
    memories = tmp_path / "memories"
    identities = Identities()
    files = MemoryFiles(memories, identities=identities)
    if request.param == "sqlite":
        from mnemo.memory.sessions import SessionStore

        db = state_database(tmp_path / "state.db")
        await db.open()
        yield Rig(
            IdentityLinks(db, files, identities, clock=clock),
            clock,
            files,
            lambda: IdentityLinks(db, MemoryFiles(memories), Identities(), clock=clock),
            SessionStore(db),
        )
        await db.close()
        return
    from mnemo.gateway.storage_pg.links import PgIdentityLinks
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.memory.pg.db import PgDatabase
    from mnemo.memory.pg.sessions import PgSessionStore

    pg = PgDatabase(
        request.getfixturevalue("pg_cluster").fresh_database(), migrations=PG_MIGRATIONS, max_size=4
    )
    await pg.open()
    yield Rig(
        PgIdentityLinks(pg, files, identities, clock=clock),
        clock,
        files,
        lambda: PgIdentityLinks(pg, MemoryFiles(memories), Identities(), clock=clock),
        PgSessionStore(pg),
    )
    await pg.close()


async def test_a_code_links_once_and_expires(rig: Rig) -> None:
    code = await rig.links.issue_code(A)
    assert (await rig.links.redeem("WRONG123", B)).status is Redeemed.WRONG
    assert (await rig.links.redeem(code, A)).status is Redeemed.OWN
    result = await rig.links.redeem(code.lower(), B)
    assert result.status is Redeemed.LINKED and result.canonical == A and set(result.members) == {A, B}
    assert (await rig.links.redeem(code, C)).status is Redeemed.WRONG, "used up"
    late = await rig.links.issue_code(C)
    rig.clock.now += CODE_TTL_S + 1
    assert (await rig.links.redeem(late, A)).status is Redeemed.EXPIRED
    assert await rig.links.members(C) == (C,)
    again = await rig.links.issue_code(B)
    assert (await rig.links.redeem(again, A)).status is Redeemed.ALREADY


async def test_link_merges_people_and_profiles_and_unlink_splits_them(rig: Rig) -> None:
    rig.files.own(A).add("Speaks Portuguese.")
    rig.files.own(B).add("Plays the oboe.")
    rig.files.own(C).add("Lives by the sea.")
    await rig.links.link(A, B)
    merged = await rig.links.link(C, B)  # B's whole person (A and B) joins C's
    assert merged.canonical == C and set(merged.members) == {A, B, C}
    rows = await rig.links.rows(A)
    assert {r.member for r in rows} == {A, B, C} and {r.canonical for r in rows} == {C}
    assert {r.linked_by for r in rows} == {"admin"}
    shared = rig.files.user(A).load().entries
    assert {"Speaks Portuguese.", "Plays the oboe.", "Lives by the sea."} <= set(shared)
    assert all(rig.files.user(x).path == rig.files.own(C).path for x in (A, B, C))
    assert not rig.files.own(A).path.exists() and not rig.files.own(B).path.exists()

    out = await rig.links.unlink(C)
    assert out.was_linked and set(out.remaining) == {A, B}
    assert rig.files.own(C).load().entries == rig.files.user(A).load().entries
    assert rig.links.identities.canonical(B) == out.canonical and out.canonical in (A, B)
    last = await rig.links.unlink(A)
    assert last.was_linked and await rig.links.members(B) == (B,)
    assert not (await rig.links.unlink(A)).was_linked
    assert rig.files.own(A).load().entries == rig.files.own(B).load().entries


async def test_another_process_change_is_seen_at_refresh(rig: Rig) -> None:
    await rig.links.refresh()
    await rig.another().link(A, B)
    assert rig.links.identities.canonical(B) == B
    await rig.links.refresh()
    assert rig.links.identities.canonical(B) == A
    await rig.another().unlink(B)
    await rig.links.refresh()
    assert not rig.links.identities.is_linked(A)


async def test_linked_dm_keys_are_the_other_accounts_private_chats(rig: Rig) -> None:
    for platform, chat_type, chat, user in (
        ("discord", "dm", "555", "2"),
        ("discord", "group", "9:2", "2"),
        ("telegram", "dm", "1", "1"),
    ):
        await rig.sessions.create_session(
            chat_key=f"{platform}:{chat_type}:{chat}",
            platform=platform,
            chat_id=chat.split(":")[0],
            thread_id=None,
            user_id=user,
            agent_context="primary",
            source="chat",
            model="m",
            system_prompt="p",
        )
    assert await rig.links.linked_dm_keys(A) == ()
    await rig.links.link(A, B)
    assert await rig.links.linked_dm_keys(A) == ("discord:dm:555",)
    assert await rig.links.linked_dm_keys(B) == ("telegram:dm:1",)


async def test_undo_takes_back_only_the_newest_link_within_24_hours(rig: Rig) -> None:
    links, clock = rig.links, rig.clock
    assert (await links.undo_latest(A)).undone == (), "nothing linked: nothing to undo"
    await links.link(A, B)
    clock.now += 3600
    await links.link(A, C)
    clock.now += 23 * 3600
    result = await links.undo_latest(B)  # from any account of the person
    assert result.undone == (C,) and set(await links.members(A)) == {A, B}
    assert rig.files.user(C).load().entries == (), "the undone account keeps no copy of the profile"
    clock.now += 2 * 3600  # A and B were linked 26 h ago
    late = await links.undo_latest(A)
    assert late.too_late and late.undone == () and set(await links.members(A)) == {A, B}
