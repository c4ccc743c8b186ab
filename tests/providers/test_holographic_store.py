"""The holographic provider's storage: opening fails loudly, migrations, FTS sync,
memory banks, vector rebuilds, and use from several threads."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from mnemo.memory.errors import ProviderError, SchemaTooNew
from mnemo.memory.manager import ManagerLimits, MemoryManager
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.providers.holographic import HolographicProvider, hrr
from mnemo.providers.holographic.entities import content_terms
from mnemo.providers.holographic.store import MIGRATIONS, SHARED, FactStore, NewFact

OWNERS = ("telegram:1", SHARED)


@pytest.fixture
def store(tmp_path: Path) -> FactStore:
    s = FactStore(tmp_path / "facts.db", dim=256)
    s.open()
    yield s
    s.close()


def db_path(home: Path) -> Path:
    return home / "providers" / "holographic" / "facts.db"


def test_a_corrupt_database_is_reported_and_its_tools_are_never_offered(home: Path) -> None:
    path = db_path(home)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a database" * 100)
    provider = HolographicProvider()
    availability = provider.is_available(home, {})
    assert not availability.ok and str(path) in availability.reason
    with pytest.raises(ProviderError, match="not a usable facts database|cannot open"):
        provider.initialize(home, {})


async def test_the_manager_does_not_register_a_provider_whose_store_is_broken(home: Path) -> None:
    path = db_path(home)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00garbage" * 512)
    manager = MemoryManager(home, ManagerLimits(init_timeout_s=5))
    manager.add_provider(HolographicProvider())
    with capture_logs() as logs:
        await manager.start()
    assert manager.tool_schemas() == [] and not manager.has_tool("fact_store")
    assert [e for e in logs if e["log_level"] == "error" and e.get("provider") == "holographic"]
    await manager.shutdown()


async def test_a_healthy_store_registers_both_tools(home: Path) -> None:
    manager = MemoryManager(home)
    manager.add_provider(HolographicProvider())
    async with manager:
        assert [t["name"] for t in manager.tool_schemas()] == ["fact_store", "fact_feedback"]
        ctx = ProviderContext("s", "c", "telegram", UserRef("telegram", "1"), AgentContext.PRIMARY, home)
        out = json.loads(
            await manager.handle_tool_call("fact_store", {"action": "add", "content": "Ivy uses Helix."}, ctx)
        )
        assert out["ok"] and out["entities"] == ["Helix", "Ivy"]
        recall = await manager.prefetch("Which editor does Ivy use?", ctx)
        assert recall is not None and "Ivy uses Helix." in recall.text
        assert recall.indicator().render() == "🧠 Holographic — recalled 1 memory"
    assert manager.backup_paths() == [db_path(home)]


def test_a_database_from_a_newer_mnemo_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "facts.db"
    FactStore(path, 128).open()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(SchemaTooNew):
        FactStore(path, 128).open()


def test_migrations_are_recorded_and_data_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "facts.db"
    s = FactStore(path, 128)
    s.open()
    s.add(NewFact("telegram:1", "Jack plays bass."))
    s.close()
    again = FactStore(path, 128)
    again.open()
    with again.reading() as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert db.execute("SELECT content FROM facts").fetchall() == [("Jack plays bass.",)]
    again.close()


def test_fts_follows_inserts_deletes_and_leaves_trust_updates_alone(store: FactStore) -> None:
    fact = store.add(NewFact("telegram:1", "Kim collects vinyl records.")).fact
    store.feedback(fact.id, True, OWNERS)

    def fts_ids(term: str) -> list[int]:
        with store.reading() as db:
            return [r[0] for r in db.execute("SELECT rowid FROM facts_fts WHERE facts_fts MATCH ?", (term,))]

    assert fts_ids("vinyl") == [fact.id]
    assert fts_ids("record") == [fact.id]  # porter stemming
    with store.reading() as db:
        db.execute("INSERT INTO facts_fts(facts_fts) VALUES ('integrity-check')")
    store.remove(fact.id, OWNERS)
    assert fts_ids("vinyl") == []


def test_removing_a_fact_drops_entities_nobody_uses_any_more(store: FactStore) -> None:
    a = store.add(NewFact("telegram:1", "Leo lives in Lima.")).fact
    store.add(NewFact("telegram:1", "Leo likes ceviche."))
    store.remove(a.id, OWNERS)
    with store.reading() as db:
        names = {r[0] for r in db.execute("SELECT name FROM entities")}
    assert names == {"Leo"}


def test_remove_needs_visibility(store: FactStore) -> None:
    fact = store.add(NewFact("telegram:1", "Mia's passport expires in 2031.")).fact
    assert store.remove(fact.id, ("telegram:2", SHARED)) is None
    assert store.remove(fact.id, OWNERS) == fact


def bank_sums(store: FactStore) -> dict[tuple[str, str], tuple[int, np.ndarray]]:
    with store.reading() as db:
        rows = db.execute("SELECT owner, category, fact_count, phasor_sum FROM memory_banks").fetchall()
    return {(o, c): (n, hrr.phasor_from_blob(b)) for o, c, n, b in rows}


def test_banks_are_updated_incrementally_and_match_a_full_rebuild(store: FactStore) -> None:
    ids = [
        store.add(
            NewFact("telegram:1", f"Fact number {i} about Nora.", "person" if i % 2 else "general")
        ).fact.id
        for i in range(12)
    ]
    for fid in ids[:5]:
        store.remove(fid, OWNERS)
    incremental = bank_sums(store)
    store.rebuild_all_vectors(store.dim)
    rebuilt = bank_sums(store)
    assert incremental.keys() == rebuilt.keys() == {("telegram:1", "person"), ("telegram:1", "general")}
    for key in incremental:
        assert incremental[key][0] == rebuilt[key][0]
        assert np.allclose(incremental[key][1], rebuilt[key][1], atol=1e-6)
    for fid in ids[5:]:
        store.remove(fid, OWNERS)
    assert bank_sums(store) == {}


def test_rebuild_all_vectors_changes_the_dimension_deterministically(store: FactStore) -> None:
    fact = store.add(NewFact("telegram:1", "Oscar sails a Laser dinghy.")).fact
    assert store.rebuild_all_vectors(512) == 1
    with store.reading() as db:
        vector = store.vectors(db, [fact.id])[0]
        assert db.execute("SELECT value FROM meta WHERE key='dim'").fetchone()[0] == "512"
    expected = hrr.encode_fact(content_terms(fact.content), fact.entities, 512)
    assert vector.shape == (512,)
    assert np.max(np.abs(np.angle(np.exp(1j * (vector - expected))))) < 1e-4
    with pytest.raises(ValueError):
        store.rebuild_all_vectors(10)


def test_changing_dim_in_the_config_re_encodes_on_start(home: Path) -> None:
    ctx = ProviderContext("s", "c", "telegram", UserRef("telegram", "1"), AgentContext.PRIMARY, home)
    p = HolographicProvider()
    p.initialize(home, {"dim": 256})
    p.handle_tool_call("fact_store", {"action": "add", "content": "Pia speaks Finnish."}, ctx)
    p.shutdown()
    q = HolographicProvider()
    q.initialize(home, {"dim": 2048})
    assert q.store is not None and q.store.dim == 2048
    with q.store.reading() as db:
        assert len(db.execute("SELECT vector FROM facts").fetchone()[0]) == 2 * 2048
    out = json.loads(q.handle_tool_call("fact_store", {"action": "probe", "entity": "Pia"}, ctx))
    assert [f["content"] for f in out["facts"]] == ["Pia speaks Finnish."]
    q.shutdown()


@pytest.mark.parametrize(("config", "reason"), [({"dim": 10}, "dim"), ({"colour": "red"}, "unknown setting")])
def test_bad_settings_make_the_provider_unavailable(
    home: Path, config: dict[str, object], reason: str
) -> None:
    availability = HolographicProvider().is_available(home, config)
    assert not availability.ok and reason in availability.reason


def test_several_threads_can_write_and_read_at_once(store: FactStore) -> None:
    from mnemo.providers.holographic.retrieval import RetrievalSettings, Retriever

    retriever = Retriever(store, RetrievalSettings(), lambda: 0.0)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(40):
                store.add(NewFact(f"telegram:{n}", f"Worker {n} wrote note {i} about Quinn."))
                retriever.search("note about Quinn", (f"telegram:{n}", SHARED), 5)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with store.reading() as db:
        assert db.execute("SELECT count(*) FROM facts").fetchone()[0] == 160
        assert db.execute("SELECT count(DISTINCT owner) FROM facts").fetchone()[0] == 4
