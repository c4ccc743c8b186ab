"""Writes queued by mnemo 0.2 — before provider writes were typed, when each provider
stored its own payload and the job's ``session_id`` held "<provider>:<write key>" — are
still sent after the upgrade: for every external provider, a ``state.db`` at the old
schema holds queued writes exactly as the old ``prepare_write`` built them; the new code
migrates it (``0013_jobs_dedupe_key``) and its job queue sends each one once, in the
speaker's scope, through the provider's own API (fakes on 127.0.0.1)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from mnemo.gateway.storage import STATE_MIGRATIONS, state_database
from mnemo.memory.db import Database
from tests.providers.external import EXTERNAL, External, request_text, scopes_in

USERS = {"alice": "telegram:1", "bob": "telegram:2"}
SCOPE = {"user_id": "telegram:1", "session_id": "20250301-120000-0a1b2c3d", "agent_id": "mnemo"}
TURN, FACT = "legacyturnwalrus", "legacyfactotter"


def legacy_writes(name: str) -> list[dict[str, Any]]:
    """A turn and a mirrored memory entry (and, where it did something of its own, a
    session end), as mnemo 0.2's ``<provider>.prepare_write`` returned them."""
    turn, fact = f"I said {TURN}", f"Keeps an {FACT}."
    head = {"scope": SCOPE}
    match name:
        case "mem0":
            bodies = [
                ("turn", {"messages": [_m("user", turn), _m("assistant", "noted")], "infer": True}),
                ("memory", {"messages": [_m("user", fact)], "infer": False}),
            ]
        case "hindsight":
            bodies = [
                ("turn", {"content": f"user: {turn}\nassistant: noted", "context": "a conversation turn"}),
                ("memory", {"content": fact, "context": "a note the assistant saved to its memory"}),
            ]
        case "honcho":
            meta = {"mnemo_key": "turn-0001", "mnemo_op": "turn"}
            peers = [("telegram:1", turn), ("mnemo", "noted")]
            bodies = [
                ("turn", {"messages": [{"peer_id": p, "content": c, "metadata": meta} for p, c in peers]}),
                ("memory", {"conclusion": fact}),
                ("session_end", {}),
            ]
        case "retaindb":
            bodies = [
                ("turn", {"messages": [_m("user", turn), _m("assistant", "noted")]}),
                ("memory", {"content": fact}),
            ]
        case "byterover":
            bodies = [
                ("turn", {"folder": "turns", "title": turn, "content": f"User: {turn}\nAssistant: noted"}),
                ("memory", {"folder": "facts", "title": fact, "content": fact}),
            ]
        case "openviking":
            bodies = [
                ("turn", {"user": turn, "assistant": "noted"}),
                ("memory", {"content": fact}),
                ("session_end", {"messages": 2}),
            ]
        case "supermemory":
            bodies = [
                ("turn", {"content": f"user: {turn}\nassistant: noted"}),
                ("memory", {"content": fact}),
            ]
        case _:
            raise AssertionError(f"no legacy payloads for {name}")
    return [{"op": op, "key": f"{op}-{i:04d}", **head, **body} for i, (op, body) in enumerate(bodies, 1)]


def _m(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


async def old_database(home: Path, name: str, payloads: list[dict[str, Any]]) -> None:
    """``state.db`` at schema step 12 with the writes queued as mnemo 0.2 queued them,
    and one done write of the same shape."""
    db = Database(home / "state.db", migrations=STATE_MIGRATIONS[:12])
    await db.open()
    now = time.time()
    rows = [(f"{name}:{p['key']}", json.dumps({"provider": name, "payload": p}), "queued") for p in payloads]
    done = {**payloads[0], "key": "turn-done"}
    rows.append((f"{name}:turn-done", json.dumps({"provider": name, "payload": done}), "done"))
    await db.write(
        lambda c: c.executemany(
            "INSERT INTO jobs(kind, session_id, payload, state, not_before, created_at, updated_at)"
            " VALUES ('provider_write', ?, ?, ?, 0, ?, ?)",
            [(*r, now, now) for r in rows],
        )
    )
    await db.close()


@pytest.mark.parametrize("external", EXTERNAL, ids=str)
async def test_writes_queued_by_the_previous_version_are_sent_once_after_the_upgrade(
    external: External, app_factory, home: Path
) -> None:
    fake = external.fake()
    await fake.start()
    try:
        external.configure(home, fake)
        payloads = legacy_writes(external.name)
        await old_database(home, external.name, payloads)
        async with app_factory(**{"memory.provider": external.name}) as app:
            app.jobs.wake()
            await app.jobs.wait_idle()
            jobs = await app.jobs.jobs(kind="provider_write")
            assert {j.state for j in jobs} == {"done"}, [j.error for j in jobs]
            # The key moved to its own column; session_id is the write's session again.
            assert sorted(j.dedupe_key or "" for j in jobs) == sorted(
                f"{external.name}:{k}" for k in [*(p["key"] for p in payloads), "turn-done"]
            )
            assert {j.session_id for j in jobs} == {SCOPE["session_id"]}
        # ByteRover refuses a commit on a stale head and the client sends it again at once.
        sent = fake.writes() if external.name == "byterover" else fake.requests
        for marker in (TURN, FACT):
            carrying = [r for r in sent if marker in request_text(r)]
            assert len(carrying) == 1, f"{marker}: {[request_text(r) for r in carrying]}"
            assert scopes_in(carrying[0], USERS) == {"alice"}
        if external.name == "honcho":
            assert [d["session_id"] for d in fake.dreams] == [SCOPE["session_id"]]
        if external.name == "openviking":
            assert [r.path for r in fake.requests if r.path.endswith("/commit")], "the session was committed"
    finally:
        await fake.stop()


MIGRATION_ROWS = [
    ("compress", "s1", {"n": 1}),
    (
        "provider_write",
        "mem0:turn-1",
        {"provider": "mem0", "payload": {**legacy_writes("mem0")[0], "key": "turn-1"}},
    ),
    (
        "provider_write",
        "mem0:forget_user-ab12",
        {
            "provider": "mem0",
            "payload": {"op": "forget_user", "key": "forget_user-ab12", "scope": {"user_id": "1"}},
        },
    ),
    ("provider_write", "mem0:memory-2", {"provider": "mem0", "payload": {**legacy_writes("mem0")[1]}}),
]
MIGRATED = [
    ("compress", "s1", None),
    ("provider_write", SCOPE["session_id"], "mem0:turn-1"),
    ("provider_write", "", "mem0:forget_user-ab12"),
    ("provider_write", SCOPE["session_id"], "mem0:memory-2"),
]


async def test_the_migration_keys_provider_writes_and_leaves_other_jobs_alone(tmp_path: Path) -> None:
    db = Database(tmp_path / "state.db", migrations=STATE_MIGRATIONS[:12])
    await db.open()
    await db.write(
        lambda c: c.executemany(
            "INSERT INTO jobs(kind, session_id, payload, created_at, updated_at) VALUES (?, ?, ?, 1, 1)",
            [(k, s, json.dumps(p)) for k, s, p in MIGRATION_ROWS],
        )
    )
    await db.close()
    upgraded = state_database(tmp_path / "state.db")
    await upgraded.open()
    found = await upgraded.read(
        lambda c: c.execute("SELECT kind, session_id, dedupe_key FROM jobs ORDER BY id").fetchall()
    )
    await upgraded.close()
    assert [tuple(r) for r in found] == MIGRATED


async def test_the_postgresql_migration_keys_provider_writes_the_same_way(pg_cluster) -> None:
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.memory.pg.db import PgDatabase

    step = next(i for i, m in enumerate(PG_MIGRATIONS) if m.name == "0013_jobs_dedupe_key")
    assert STATE_MIGRATIONS[12].name == "0013_jobs_dedupe_key"
    url = pg_cluster.fresh_database()
    old = PgDatabase(url, migrations=PG_MIGRATIONS[:step], max_size=1)
    await old.open()

    async def insert(c: Any) -> None:
        for kind, session, payload in MIGRATION_ROWS:
            await c.execute(
                "INSERT INTO jobs(kind, session_id, payload, created_at, updated_at) VALUES (%s, %s, %s, 1, 1)",
                (kind, session, json.dumps(payload)),
            )

    await old.write(insert)
    await old.close()
    new = PgDatabase(url, migrations=PG_MIGRATIONS[: step + 1], max_size=1)
    await new.open()

    async def rows(c: Any) -> list[tuple[Any, ...]]:
        cur = await c.execute("SELECT kind, session_id, dedupe_key FROM jobs ORDER BY id")
        return [(r["kind"], r["session_id"], r["dedupe_key"]) for r in await cur.fetchall()]

    found = await new.read(rows)
    await new.close()
    assert found == MIGRATED
