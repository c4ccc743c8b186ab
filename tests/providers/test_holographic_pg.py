"""The holographic provider with its facts on PostgreSQL (``pg_store.py``).

Every test of ``test_holographic.py`` runs again here with the provider pointed at a
fresh database of the throw-away cluster (the ``facts`` fixture below replaces the
SQLite one), so the tools behave the same on both backends. Then what only PostgreSQL
has: two provider instances — two replicas — sharing one set of facts, concurrent
writes from both, per-user isolation across them, erasure, the schema guard, and the
composition root handing ``database.url`` to the provider.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from mnemo.memory.curated import Action, Target
from mnemo.memory.errors import ProviderError
from mnemo.memory.memory_tool import MemoryWrite
from mnemo.providers.holographic import HolographicProvider
from mnemo.providers.holographic.erasure import count_owner_pg, erase_owner_pg
from mnemo.providers.holographic.pg_store import PgFactStore
from tests.providers import test_holographic as sqlite_suite
from tests.providers.test_holographic import ALICE, BOB, KNOWN, Facts, context, known  # noqa: F401 - fixture
from tests.support.pgcluster import Cluster

# The whole SQLite suite, collected again in this module: its ``facts`` fixture is this one.
globals().update({name: fn for name, fn in vars(sqlite_suite).items() if name.startswith("test_")})


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> str:
    return pg_cluster.fresh_database()


@pytest.fixture
def facts(home: Path, pg_url: str) -> Iterator[Facts]:
    f = Facts(home, {"database_url": pg_url})
    yield f
    f.provider.shutdown()


@pytest.fixture
def replicas(tmp_path: Path, pg_url: str) -> Iterator[tuple[Facts, Facts]]:
    """Two providers as two replicas would run them: separate homes, one database."""
    a_home, b_home = tmp_path / "a", tmp_path / "b"
    a_home.mkdir()
    b_home.mkdir()
    a, b = Facts(a_home, {"database_url": pg_url}), Facts(b_home, {"database_url": pg_url})
    yield a, b
    a.provider.shutdown()
    b.provider.shutdown()


def _rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def test_the_facts_are_in_postgresql_not_in_the_profile(facts: Facts, home: Path, pg_url: str) -> None:
    facts.add("Alice lives in Paris.")
    assert not (home / "providers" / "holographic" / "facts.db").exists()
    assert _rows(pg_url, "SELECT owner, content, trust FROM holographic.facts") == [
        ("telegram:1", "Alice lives in Paris.", 0.5)
    ]
    assert facts.provider.backup_paths(home) == ()


def test_a_fact_added_on_one_replica_is_recalled_on_the_other(replicas: tuple[Facts, Facts]) -> None:
    a, b = replicas
    for text in KNOWN:
        a.add(text)
    assert "Bob drinks coffee." in b.contents(b.call(action="search", query="who drinks coffee")["results"])
    probe = b.call(action="probe", entity="Carol")
    assert b.contents(probe["facts"]) == ["Carol manages the Falcon project at Acme with Alice."]
    reason = b.call(action="reason", entities=["Alice", "Acme"])
    assert sorted(b.contents(reason["facts"])) == [
        "Alice works at Acme with Bob.",
        "Carol manages the Falcon project at Acme with Alice.",
    ]
    recall = b.provider.prefetch("Where does Alice live?", context(b.home))
    assert "Alice lives in Paris." in recall.text
    # Adding on B what A stored is a duplicate, not a second row.
    again = b.call(action="add", content="Bob drinks coffee.")
    assert again["duplicate"] is True


def test_feedback_and_removal_on_one_replica_are_seen_by_the_other(replicas: tuple[Facts, Facts]) -> None:
    a, b = replicas
    fid = a.add("Dana plays the cello.")
    assert b.call(tool="fact_feedback", fact_id=fid, helpful=True)["trust"] == 0.55
    assert a.call(action="search", query="Dana cello")["results"][0]["trust"] == 0.55
    # A mirrored USER.md entry added through replica A and removed through replica B.
    entry = "Prefers short answers."
    a.provider.on_memory_write(MemoryWrite(Action.ADD, Target.USER, ALICE, entry, None), context(a.home))
    assert b.contents(b.call(action="search", query="short answers")["results"]) == [entry]
    b.provider.on_memory_write(MemoryWrite(Action.REMOVE, Target.USER, ALICE, None, entry), context(b.home))
    assert a.call(action="search", query="short answers")["results"] == []


def test_one_users_facts_never_reach_another_user_on_any_replica(replicas: tuple[Facts, Facts]) -> None:
    a, b = replicas
    secret = a.add("Alice's locker code is 4711.", ALICE)
    b.add("Bob's locker is in the basement.", BOB)
    for replica in (a, b):
        for action in (
            {"action": "search", "query": "locker code 4711"},
            {"action": "probe", "entity": "Alice"},
            {"action": "contradict"},
            {"action": "related", "entity": "Alice"},
        ):
            out = json.dumps(replica.call(BOB, **action))
            assert "4711" not in out and "Alice" not in out.replace('"entity": "Alice"', "")
        assert replica.call(BOB, tool="fact_feedback", fact_id=secret, helpful=False)["ok"] is False
        assert "4711" not in replica.provider.prefetch("locker code", context(replica.home, BOB)).text
        assert "4711" in replica.provider.prefetch("locker code", context(replica.home, ALICE)).text


def test_concurrent_writes_from_two_replicas_lose_nothing(replicas: tuple[Facts, Facts], pg_url: str) -> None:
    a, b = replicas
    texts = [f"Project number {i} belongs to team {i % 3}." for i in range(30)]
    errors: list[BaseException] = []

    def writer(replica: Facts) -> None:
        try:
            for text in texts:  # both replicas add the same facts, in the same order
                out = replica.call(action="add", content=text, category="project")
                assert out["ok"], out
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(r,)) for r in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _rows(pg_url, "SELECT count(*) FROM holographic.facts") == [(30,)]
    # The running bank sum counts each fact once: no lost or doubled update.
    assert _rows(pg_url, "SELECT owner, category, fact_count FROM holographic.memory_banks") == [
        ("telegram:1", "project", 30)
    ]
    hint = {c["category"]: c["facts"] for c in b.call(action="probe", entity="Project")["categories"]}
    assert hint.get("project") in (None, 30)


def test_erasing_a_user_removes_their_facts_and_only_theirs(
    replicas: tuple[Facts, Facts], pg_url: str
) -> None:
    a, b = replicas
    a.add("Alice met Zoltan in Prague.", ALICE)
    a.add("Alice likes green tea.", ALICE)
    b.add("Bob met Zoltan in Vienna.", BOB)
    assert count_owner_pg(pg_url, str(ALICE)) == 2
    assert erase_owner_pg(pg_url, str(ALICE)) == 2
    assert count_owner_pg(pg_url, str(ALICE)) == 0
    assert a.call(ALICE, action="search", query="green tea Prague")["results"] == []
    assert b.contents(b.call(BOB, action="probe", entity="Zoltan")["facts"]) == ["Bob met Zoltan in Vienna."]
    names = {r[0] for r in _rows(pg_url, "SELECT name FROM holographic.entities")}
    assert "Prague" not in names and "Alice" not in names and {"Bob", "Zoltan", "Vienna"} <= names
    assert _rows(pg_url, "SELECT owner FROM holographic.memory_banks") == [("telegram:2",)]


def test_erasure_on_a_database_without_facts_is_a_no_op(pg_url: str) -> None:
    assert count_owner_pg(pg_url, "telegram:1") == 0
    assert erase_owner_pg(pg_url, "telegram:1") == 0


def test_two_replicas_starting_together_create_the_schema_once(pg_url: str) -> None:
    stores = [PgFactStore(pg_url) for _ in range(4)]
    threads = [threading.Thread(target=s.open) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert _rows(pg_url, "SELECT version, name FROM holographic.schema_migrations") == [
            (1, "0001_facts_entities_banks")
        ]
        assert all(s.db.execute("SELECT 1").fetchone() == (1,) for s in stores)
    finally:
        for s in stores:
            s.close()


def test_a_schema_from_a_newer_mnemo_is_refused(home: Path, pg_url: str) -> None:
    PgFactStore(pg_url).open()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO holographic.schema_migrations(version, name) VALUES (2, 'from_the_future')")
    with pytest.raises(ProviderError, match="newer than this mnemo"):
        HolographicProvider().initialize(home, {"database_url": pg_url})


def test_an_unreachable_database_is_one_clear_error(home: Path, tmp_path: Path) -> None:
    url = f"postgresql://mnemo@/nothing?host={tmp_path}"
    with pytest.raises(ProviderError, match="cannot connect to PostgreSQL"):
        HolographicProvider().initialize(home, {"database_url": url})


def test_a_changed_dimension_re_encodes_the_shared_facts(home: Path, pg_url: str) -> None:
    f = Facts(home, {"database_url": pg_url})
    f.add("Alice lives in Paris.")
    f.provider.shutdown()
    g = Facts(home, {"database_url": pg_url, "dim": 512})
    try:
        assert g.provider.store is not None and g.provider.store.dim == 512
        assert _rows(pg_url, "SELECT value FROM holographic.meta WHERE key = 'dim'") == [("512",)]
        assert g.contents(g.call(action="probe", entity="Alice")["facts"]) == ["Alice lives in Paris."]
    finally:
        g.provider.shutdown()


def test_the_composition_root_passes_the_database_url(home: Path, pg_url: str) -> None:
    from mnemo.gateway.config import load_settings
    from mnemo.gateway.turns.providers import shared_database_config

    on_pg = load_settings(home, environ={"MNEMO_DATABASE_URL": pg_url})
    on_sqlite = load_settings(home, environ={})
    provider = HolographicProvider()
    config = shared_database_config(on_pg, provider)
    assert config is not None and config["database_url"] == pg_url and config["dim"] == 1024
    assert shared_database_config(on_sqlite, provider) is None
    assert provider.is_available(home, config).ok
    provider.initialize(home, config)
    try:
        assert isinstance(provider.store, PgFactStore)
    finally:
        provider.shutdown()


def test_migrate_copies_facts_db_into_postgresql_once(home: Path, pg_url: str) -> None:
    from mnemo.providers.holographic.pg_store import copy_facts

    local = Facts(home)  # the SQLite store of a profile
    paris = local.add("Alice lives in Paris.", ALICE)
    local.add("Bob drinks coffee.", BOB)
    local.add("The deploy server runs Debian.", None)
    local.call(ALICE, tool="fact_feedback", fact_id=paris, helpful=True)
    local.provider.shutdown()
    path = home / "providers" / "holographic" / "facts.db"
    before = path.read_bytes()

    first = copy_facts(path, pg_url)
    assert (first.source, first.copied, first.present, first.verified) == (3, 3, 0, True)
    again = copy_facts(path, pg_url)
    assert (again.source, again.copied, again.present, again.verified) == (3, 0, 3, True)
    assert path.read_bytes() == before  # the source is never modified

    shared = Facts(home, {"database_url": pg_url})
    try:
        hit = shared.call(ALICE, action="probe", entity="Alice")["facts"]
        assert [(h["fact_id"], h["content"], h["trust"]) for h in hit] == [
            (paris, "Alice lives in Paris.", 0.55)
        ]
        assert shared.call(BOB, action="search", query="Paris")["results"] == []
        assert shared.contents(shared.call(BOB, action="search", query="coffee")["results"]) == [
            "Bob drinks coffee."
        ]
        # Banks came along: the category hint of the copied fact is found.
        assert [c["category"] for c in shared.call(ALICE, action="probe", entity="Alice")["categories"]] == [
            "general"
        ]
        new = shared.add("Alice owns a bicycle.", ALICE)
        assert new > paris  # the id sequence continues after the copied ids
    finally:
        shared.provider.shutdown()


def test_migrate_refuses_a_file_that_is_not_a_facts_database(tmp_path: Path, pg_url: str) -> None:
    import sqlite3

    from mnemo.memory.errors import StoreError
    from mnemo.providers.holographic.pg_store import copy_facts

    bogus = tmp_path / "facts.db"
    conn = sqlite3.connect(bogus)
    conn.execute("CREATE TABLE facts (id INTEGER PRIMARY KEY, content TEXT)")
    conn.close()
    with pytest.raises(StoreError, match="not a usable facts database"):
        copy_facts(bogus, pg_url)


async def test_mnemo_migrate_reports_the_copied_facts(home: Path, pg_url: str) -> None:
    from mnemo.gateway.storage import state_database
    from tests.gateway.test_cli_errors import mnemo

    db = state_database(home / "state.db")
    await db.open()
    await db.close()
    local = Facts(home)
    local.add("Alice lives in Paris.", ALICE)
    local.provider.shutdown()

    out = mnemo(home, "migrate", "--to", pg_url, "--json")
    assert out.returncode == 0, out.stderr
    receipt = json.loads(out.stdout)
    assert receipt["facts"] == {"source": 1, "copied": 1, "present": 0, "verified": True}
    assert not any(n["what"] == "provider data providers/holographic" for n in receipt["not_migrated"])
    assert _rows(pg_url, "SELECT owner, content FROM holographic.facts") == [
        ("telegram:1", "Alice lives in Paris.")
    ]

    text = mnemo(home, "migrate", "--to", pg_url)
    assert "holographic facts: 1 in facts.db: 0 copied, 1 already there, verified" in text.stdout, text.stdout


async def test_open_providers_puts_the_bots_facts_in_its_postgresql_database(home: Path, pg_url: str) -> None:
    from mnemo.gateway.config import load_settings
    from mnemo.gateway.turns.providers import open_providers

    settings = load_settings(
        home, environ={"MNEMO_DATABASE_URL": pg_url}, overrides={"memory.provider": "holographic"}
    )
    manager = await open_providers(settings)
    try:
        assert "fact_store" in [s["name"] for s in manager.tool_schemas()]
        out = json.loads(
            await manager.handle_tool_call(
                "fact_store", {"action": "add", "content": "Alice lives in Paris."}, context(home)
            )
        )
        assert out["ok"], out
    finally:
        await manager.shutdown()
    assert _rows(pg_url, "SELECT owner, content FROM holographic.facts") == [
        ("telegram:1", "Alice lives in Paris.")
    ]
    assert not (home / "providers" / "holographic" / "facts.db").exists()
