"""SQLite storage of the holographic provider: facts, entities, vectors, banks.

One file, ``$MNEMO_HOME/providers/holographic/facts.db``, WAL mode (on PostgreSQL the
same tables in the schema ``holographic``: ``pg_store.py``). Tables:

* ``facts`` — content (unique per owner), category, tags, source (``tool`` / ``mirror``
  / ``cli``), owner (``platform:id`` or ``shared``), trust in [0, 1] (0.5 to start),
  retrieval and helpful counts, timestamps, and the HRR vector (uint16 phases);
* ``entities`` — one row per name (case-insensitive), ``fact_entities`` links them;
* ``facts_fts`` — FTS5 external-content index over content, tags and owner, kept in
  sync by triggers (trust/count updates do not touch it). The owner column lets a
  search intersect with the caller's facts *before* bm25 ranks anything — ranking every
  match of a common word across all users dominated search time at 100k facts. It is
  only a prefilter (tokenizing can make two owners look alike); the exact
  ``facts.owner`` check always follows;
* ``memory_banks`` — per (owner, category), the running sum of the members' phasors,
  so adding or removing a fact updates the bank in O(dim) and
  ``phase_of(sum)`` is the bundle of the category;
* ``meta`` — the vector dimension.

Migrations are named and append-only; ``PRAGMA user_version`` counts the applied ones,
and a database from a newer mnemo is refused (``SchemaTooNew``).

Threading: one connection shared by the manager's worker threads, serialized by a
lock; every method is synchronous and must be called off the event loop. Scoping is
not decided here: every read takes the ``owners`` it may see.

Journal: with a ``journal`` bound (``memory/journal.py``), every add, removal and trust
change is journaled with the caller's provenance. ``facts.db`` is not the journal's
database, so a write holds ``facts.db.lock`` (a file lock) while its entries are staged
in the journal, the facts are written together with one ``journal_marks`` row per entry
(the evidence) in one transaction, and the entries committed: an entry a killed writer
left staged is kept when its mark is in ``facts.db``, dropped when not. On PostgreSQL
the entries go into the facts' own transaction (``pg_store.py``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import structlog

from mnemo.memory.atomic import exclusive_lock
from mnemo.memory.db import create_private_database
from mnemo.memory.errors import SchemaTooNew, StoreError
from mnemo.memory.journal import (
    MARKS_SQL,
    DocumentJournal,
    Layer,
    MarkEvidence,
    NewEntry,
    Provenance,
    commit_written,
    mark_within,
)
from mnemo.memory.threats import guard_write
from mnemo.providers.holographic import hrr
from mnemo.providers.holographic.entities import content_terms, extract_entities, ngrams

log = structlog.get_logger(__name__)

SHARED = "shared"
DEFAULT_TRUST = 0.5

MIGRATIONS: tuple[tuple[str, str], ...] = (
    (
        "0001_facts_entities_banks",
        """
        CREATE TABLE facts (
            id INTEGER PRIMARY KEY,
            owner TEXT NOT NULL,
            content TEXT NOT NULL,
            category TEXT NOT NULL DEFAULT 'general',
            tags TEXT NOT NULL DEFAULT '',
            source TEXT NOT NULL DEFAULT 'tool',
            trust REAL NOT NULL DEFAULT 0.5,
            retrieval_count INTEGER NOT NULL DEFAULT 0,
            helpful_count INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            vector BLOB NOT NULL,
            UNIQUE (owner, content)
        );
        CREATE INDEX facts_owner_category ON facts(owner, category);
        CREATE INDEX facts_owner_updated ON facts(owner, updated_at);
        CREATE TABLE entities (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            name_lc TEXT NOT NULL UNIQUE,
            type TEXT NOT NULL DEFAULT 'unknown'
        );
        CREATE TABLE fact_entities (
            fact_id INTEGER NOT NULL REFERENCES facts(id) ON DELETE CASCADE,
            entity_id INTEGER NOT NULL REFERENCES entities(id) ON DELETE CASCADE,
            PRIMARY KEY (fact_id, entity_id)
        ) WITHOUT ROWID;
        CREATE INDEX fact_entities_entity ON fact_entities(entity_id, fact_id);
        CREATE TABLE memory_banks (
            owner TEXT NOT NULL,
            category TEXT NOT NULL,
            fact_count INTEGER NOT NULL,
            phasor_sum BLOB NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (owner, category)
        );
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE VIRTUAL TABLE facts_fts USING fts5(
            content, tags, owner, content='facts', content_rowid='id',
            tokenize='porter unicode61 remove_diacritics 2'
        );
        CREATE TRIGGER facts_ai AFTER INSERT ON facts BEGIN
            INSERT INTO facts_fts(rowid, content, tags, owner) VALUES (new.id, new.content, new.tags, new.owner);
        END;
        CREATE TRIGGER facts_ad AFTER DELETE ON facts BEGIN
            INSERT INTO facts_fts(facts_fts, rowid, content, tags, owner)
            VALUES ('delete', old.id, old.content, old.tags, old.owner);
        END;
        CREATE TRIGGER facts_au AFTER UPDATE OF content, tags, owner ON facts BEGIN
            INSERT INTO facts_fts(facts_fts, rowid, content, tags, owner)
            VALUES ('delete', old.id, old.content, old.tags, old.owner);
            INSERT INTO facts_fts(rowid, content, tags, owner) VALUES (new.id, new.content, new.tags, new.owner);
        END;
        """,
    ),
    ("0002_journal_marks", MARKS_SQL + ";"),
)

_FACT_COLUMNS = (
    "f.id, f.owner, f.content, f.category, f.tags, f.source, f.trust, "
    "f.retrieval_count, f.helpful_count, f.created_at, f.updated_at"
)


@dataclass(frozen=True, slots=True)
class Fact:
    id: int
    owner: str
    content: str
    category: str
    tags: str
    source: str
    trust: float
    retrieval_count: int
    helpful_count: int
    created_at: float
    updated_at: float
    entities: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Candidate:
    """The part of a fact that ranking reads."""

    id: int
    content: str
    trust: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class NewFact:
    owner: str
    content: str
    category: str = "general"
    tags: str = ""
    source: str = "tool"


@dataclass(frozen=True, slots=True)
class Added:
    fact: Fact
    created: bool  # False: the owner already had this exact content


def _placeholders(n: int) -> str:
    return ",".join("?" * n)


class Conn(Protocol):
    """What the store's SQL runs on: a ``sqlite3.Connection``, or the PostgreSQL
    adapter of ``pg_store`` (same ``?`` placeholders, tuples back)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...


class FactStore:
    """The SQLite fact store. ``pg_store.PgFactStore`` overrides the few statements
    whose SQL differs (the ``_SQL_*`` strings, the FTS and neighbour queries, inserts
    that return an id) and the connection handling; everything else is shared."""

    _SQL_FIND = "SELECT id FROM facts WHERE owner=? AND content=?"
    _SQL_LINK = "INSERT OR IGNORE INTO fact_entities(fact_id, entity_id) VALUES (?,?)"
    _SQL_CONTAINS = "instr(content, ?) > 0"
    _SQL_CLAMPED_TRUST = "min(1.0, max(0.0, trust + ?))"
    _SQL_PUT_BANK = (
        "INSERT OR REPLACE INTO memory_banks(owner, category, fact_count, phasor_sum,"
        " updated_at) VALUES (?,?,?,?,?)"
    )
    _SQL_PUT_DIM = "INSERT OR REPLACE INTO meta(key, value) VALUES ('dim', ?)"

    def __init__(
        self, path: Path, dim: int = hrr.DEFAULT_DIM, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path)
        self.dim = dim
        self.clock = clock
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self.journal: DocumentJournal | None = None  # bound by the provider (None: not journaled)

    # --- lifecycle ----------------------------------------------------------------
    def open(self) -> None:
        """Open (creating if needed) and migrate. Raises ``StoreError`` when the file
        is not a usable database — callers must fail loudly, never carry on."""
        with self._lock:
            if self._db is not None:
                return
            create_private_database(self.path)  # facts about people: 0600, folders 0700
            try:
                db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=5.0)
            except sqlite3.Error as e:
                raise StoreError(f"{self.path}: cannot open: {e}") from e
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("PRAGMA foreign_keys=ON")
                self._migrate(db)
                stored = db.execute("SELECT value FROM meta WHERE key='dim'").fetchone()
                if stored is None:
                    db.execute("INSERT INTO meta(key, value) VALUES ('dim', ?)", (str(self.dim),))
                    stored_dim = self.dim
                else:
                    stored_dim = int(stored[0])
            except (sqlite3.Error, ValueError) as e:
                db.close()
                raise StoreError(f"{self.path}: not a usable facts database: {e}") from e
            except BaseException:
                db.close()
                raise
            self._db = db
            wanted, self.dim = self.dim, stored_dim
        if wanted != stored_dim:
            self.rebuild_all_vectors(wanted)

    def _migrate(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise SchemaTooNew(
                f"{self.path}: schema version {version} is newer than this mnemo ({len(MIGRATIONS)})"
            )
        for index in range(version, len(MIGRATIONS)):
            _, sql = MIGRATIONS[index]
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _split_sql(sql):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {index + 1}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                self._db.close()
                self._db = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError("the facts database is not open")
        return self._db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = self.db
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self.db

    # --- the journal ----------------------------------------------------------------
    def _journal_lock(self) -> AbstractContextManager[None]:
        """Held from staging to committing (the lock the entries' evidence names)."""
        return exclusive_lock(self.path.with_name(self.path.name + ".lock"))

    def _record(self, db: Conn, entry: NewEntry, staged: list[int]) -> None:
        """Journal ``entry`` from inside this store's write transaction."""
        assert self.journal is not None
        token = uuid.uuid4().hex
        evidence = MarkEvidence(self.path.with_name(self.path.name + ".lock"), self.path, token)
        staged.append(self.journal.stage(entry, evidence))
        mark_within(db, token, self.clock())

    @contextmanager
    def _journaled(self) -> Iterator[tuple[Conn, Callable[[NewEntry], None]]]:
        """A write transaction whose ``record(entry)`` calls journal its changes, both
        or neither (module docstring)."""
        journal = self.journal
        if journal is None:
            with self._write() as db:
                yield db, lambda entry: None
            return
        staged: list[int] = []
        with self._lock, self._journal_lock():
            try:
                with self._write() as db:
                    yield db, lambda entry: self._record(db, entry, staged)
            except BaseException:
                for entry_id in staged:
                    journal.abort(entry_id)
                raise
            for entry_id in staged:
                commit_written(journal, entry_id)

    # --- writes -------------------------------------------------------------------
    def add(self, new: NewFact, by: Provenance | None = None) -> Added:
        return self.add_many([new], by)[0]

    def add_many(self, facts: Sequence[NewFact], by: Provenance | None = None) -> list[Added]:
        """Insert facts in one transaction (existing content of the same owner is
        returned as-is, not duplicated). Every text is threat-scanned first: one
        refused fact refuses the batch (``MemoryRefused``) and nothing is written."""
        for new in facts:
            guard_write(new.content, "the fact")
            guard_write(new.category, "the category")
            guard_write(new.tags, "the tags")
        out: list[Added] = []
        banks: dict[tuple[str, str], tuple[np.ndarray, int]] = {}
        with self._journaled() as (db, record):
            for new in facts:
                row = db.execute(self._SQL_FIND, self._find_params(new.owner, new.content)).fetchone()
                if row is not None:
                    out.append(Added(self._require_fact(db, row[0]), created=False))
                    continue
                names = self._entities_in(db, new.content, (new.owner, SHARED))
                blob = hrr.to_blob(hrr.encode_fact(content_terms(new.content), names, self.dim))
                now = self.clock()
                fact_id = self._insert_id(
                    db,
                    "INSERT INTO facts(owner, content, category, tags, source, trust, created_at, updated_at, vector)"
                    " VALUES (?,?,?,?,?,?,?,?,?)",
                    (
                        new.owner,
                        new.content,
                        new.category,
                        new.tags,
                        new.source,
                        DEFAULT_TRUST,
                        now,
                        now,
                        blob,
                    ),
                )
                for name in names:
                    entity_id = self._entity_id(db, name)
                    db.execute(self._SQL_LINK, (fact_id, entity_id))
                # Banks sum the stored (quantized) vectors, so a later removal subtracts
                # exactly what was added; one bank write per category per transaction.
                total, n = banks.get((new.owner, new.category), (np.zeros(self.dim, dtype=np.complex128), 0))
                banks[(new.owner, new.category)] = (total + hrr.phasors(hrr.from_blob(blob)), n + 1)
                out.append(Added(self._require_fact(db, fact_id), created=True))
                record(
                    self._entry("add", new.owner, None, new.content, by, f"fact {fact_id} ({new.category})")
                )
            for (owner, category), (total, n) in banks.items():
                self._bank_add(db, owner, category, total, n)
        return out

    def remove(self, fact_id: int, owners: Sequence[str], by: Provenance | None = None) -> Fact | None:
        """Delete a fact the caller can see; returns it, or None if there was none."""
        with self._journaled() as (db, record):
            fact = self._fact(db, fact_id, owners)
            if fact is None:
                return None
            self._delete(db, fact)
            record(self._entry("remove", fact.owner, fact.content, None, by, f"fact {fact.id}"))
            return fact

    def remove_mirrored(
        self, owner: str, category: str, old_text: str, by: Provenance | None = None
    ) -> Fact | None:
        """Delete the mirrored copy of a built-in entry: the exact content first, else
        the newest mirrored fact containing ``old_text``."""
        with self._journaled() as (db, record):
            row = db.execute(
                "SELECT id FROM facts WHERE owner=? AND category=? AND source='mirror' AND content=?",
                (owner, category, old_text),
            ).fetchone()
            if row is None:
                row = db.execute(
                    f"SELECT id FROM facts WHERE owner=? AND category=? AND source='mirror' AND {self._SQL_CONTAINS}"
                    " ORDER BY updated_at DESC, id DESC LIMIT 1",
                    (owner, category, old_text),
                ).fetchone()
            if row is None:
                return None
            fact = self._require_fact(db, row[0])
            self._delete(db, fact)
            record(self._entry("remove", fact.owner, fact.content, None, by, f"fact {fact.id}"))
            return fact

    def _delete(self, db: Conn, fact: Fact) -> None:
        blob = db.execute("SELECT vector FROM facts WHERE id=?", (fact.id,)).fetchone()[0]
        entity_ids = [
            r[0] for r in db.execute("SELECT entity_id FROM fact_entities WHERE fact_id=?", (fact.id,))
        ]
        db.execute("DELETE FROM facts WHERE id=?", (fact.id,))
        self._bank_add(db, fact.owner, fact.category, -hrr.phasors(hrr.from_blob(blob)), -1)
        if entity_ids:
            db.execute(
                f"DELETE FROM entities WHERE id IN ({_placeholders(len(entity_ids))})"
                " AND NOT EXISTS (SELECT 1 FROM fact_entities fe WHERE fe.entity_id = entities.id)",
                entity_ids,
            )

    def feedback(
        self, fact_id: int, helpful: bool, owners: Sequence[str], by: Provenance | None = None
    ) -> Fact | None:
        """Helpful: trust +0.05 (and helpful_count +1); not helpful: −0.10; clamped."""
        delta = 0.05 if helpful else -0.10
        with self._journaled() as (db, record):
            before = self._fact(db, fact_id, owners)
            if before is None:
                return None
            db.execute(
                f"UPDATE facts SET trust = {self._SQL_CLAMPED_TRUST}, helpful_count = helpful_count + ?"
                " WHERE id=?",
                (delta, 1 if helpful else 0, fact_id),
            )
            after = self._require_fact(db, fact_id)
            note = f"fact {fact_id}: {'helpful' if helpful else 'not helpful'}"
            record(
                self._entry(
                    "feedback", after.owner, f"trust {before.trust:.2f}", f"trust {after.trust:.2f}", by, note
                )
            )
            return after

    @staticmethod
    def _entry(
        op: str, owner: str, old: str | None, new: str | None, by: Provenance | None, note: str
    ) -> NewEntry:
        return NewEntry(Layer.FACTS, owner, op, old, new, by or Provenance.system(), note)

    def count_retrievals(self, fact_ids: Iterable[int]) -> None:
        ids = sorted(set(fact_ids))
        if not ids:
            return
        with self._write() as db:
            db.execute(
                f"UPDATE facts SET retrieval_count = retrieval_count + 1 WHERE id IN ({_placeholders(len(ids))})",
                ids,
            )

    def rebuild_all_vectors(self, dim: int) -> int:
        """Re-encode every fact at ``dim`` and rebuild the banks; returns the count.

        Needed when the dimension changes; atoms are deterministic, so the result is
        the same as if the facts had been added at ``dim`` in the first place."""
        hrr.encode_atom("", dim)  # validates dim before anything is touched
        with self._write() as db:
            rows = db.execute("SELECT id, content, owner, category FROM facts ORDER BY id").fetchall()
            links = self._entity_names(db, [r[0] for r in rows])
            banks: dict[tuple[str, str], tuple[np.ndarray, int]] = {}
            for fact_id, content, owner, category in rows:
                blob = hrr.to_blob(hrr.encode_fact(content_terms(content), links.get(fact_id, ()), dim))
                db.execute("UPDATE facts SET vector=? WHERE id=?", (blob, fact_id))
                total, n = banks.get((owner, category), (np.zeros(dim, dtype=np.complex128), 0))
                banks[(owner, category)] = (total + hrr.phasors(hrr.from_blob(blob)), n + 1)
            db.execute("DELETE FROM memory_banks")
            now = self.clock()
            for (owner, category), (total, n) in banks.items():
                db.execute(self._SQL_PUT_BANK, (owner, category, n, hrr.phasor_to_blob(total), now))
            db.execute(self._SQL_PUT_DIM, (str(dim),))
            self.dim = dim
            return len(rows)

    # --- entities -------------------------------------------------------------------
    def _entities_in(self, db: Conn, text: str, owners: Sequence[str]) -> list[str]:
        names = extract_entities(text)
        seen = {n.lower() for n in names}
        for _, name in self.known_entities(db, ngrams(text), owners).values():
            if name.lower() not in seen:
                seen.add(name.lower())
                names.append(name)
        return names

    def known_entities(
        self, db: Conn, names_lc: Iterable[str], owners: Sequence[str]
    ) -> dict[str, tuple[int, str]]:
        """Which of ``names_lc`` name an entity linked to a fact the owners can see
        (lower-case name → (id, display name)). Entities only others can see stay
        unknown, so extraction never reveals another user's vocabulary."""
        keys = sorted(set(names_lc))
        out: dict[str, tuple[int, str]] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            rows = db.execute(
                f"SELECT e.name_lc, e.id, e.name FROM entities e WHERE e.name_lc IN ({_placeholders(len(chunk))})"
                " AND EXISTS (SELECT 1 FROM fact_entities fe JOIN facts f ON f.id = fe.fact_id"
                f" WHERE fe.entity_id = e.id AND f.owner IN ({_placeholders(len(owners))}))",
                (*chunk, *owners),
            )
            out.update({lc: (eid, name) for lc, eid, name in rows})
        return out

    def _entity_id(self, db: Conn, name: str) -> int:
        row = db.execute("SELECT id FROM entities WHERE name_lc=?", (name.lower(),)).fetchone()
        if row is not None:
            return int(row[0])
        return self._insert_id(db, "INSERT INTO entities(name, name_lc) VALUES (?,?)", (name, name.lower()))

    def _find_params(self, owner: str, content: str) -> tuple[str, ...]:
        return (owner, content)

    def _insert_id(self, db: Conn, sql: str, params: Sequence[Any]) -> int:
        """Run an INSERT and return the new row's id."""
        return int(db.execute(sql, params).lastrowid or 0)

    def _entity_names(self, db: Conn, fact_ids: Sequence[int]) -> dict[int, tuple[str, ...]]:
        out: dict[int, list[str]] = {}
        for start in range(0, len(fact_ids), 500):
            chunk = list(fact_ids[start : start + 500])
            rows = db.execute(
                "SELECT fe.fact_id, e.name FROM fact_entities fe JOIN entities e ON e.id = fe.entity_id"
                f" WHERE fe.fact_id IN ({_placeholders(len(chunk))}) ORDER BY e.name_lc",
                chunk,
            )
            for fact_id, name in rows:
                out.setdefault(fact_id, []).append(name)
        return {k: tuple(v) for k, v in out.items()}

    # --- reads ---------------------------------------------------------------------
    def _fact(self, db: Conn, fact_id: int, owners: Sequence[str] | None = None) -> Fact | None:
        found = self.facts(db, [fact_id], owners)
        return found[0] if found else None

    def _require_fact(self, db: Conn, fact_id: int) -> Fact:
        """A fact this transaction just found or wrote (it exists)."""
        fact = self._fact(db, fact_id)
        if fact is None:
            raise StoreError(f"fact {fact_id} vanished inside its own transaction")
        return fact

    def facts(self, db: Conn, fact_ids: Sequence[int], owners: Sequence[str] | None = None) -> list[Fact]:
        """Facts by id, in the order given, skipping ids the owners cannot see."""
        if not fact_ids:
            return []
        by_id: dict[int, Fact] = {}
        names = self._entity_names(db, list(fact_ids))
        for start in range(0, len(fact_ids), 500):
            chunk = list(fact_ids[start : start + 500])
            sql = f"SELECT {_FACT_COLUMNS} FROM facts f WHERE f.id IN ({_placeholders(len(chunk))})"
            params: list[object] = list(chunk)
            if owners is not None:
                sql += f" AND f.owner IN ({_placeholders(len(owners))})"
                params.extend(owners)
            for row in db.execute(sql, params):
                by_id[row[0]] = _fact_of(row, names.get(row[0], ()))
        return [by_id[i] for i in fact_ids if i in by_id]

    def candidates(
        self, db: Conn, fact_ids: Sequence[int], owners: Sequence[str]
    ) -> tuple[list[Candidate], np.ndarray]:
        """What scoring needs of each visible fact, in the order given, and their vectors
        as a uint16 code matrix (one row per candidate)."""
        rows: dict[int, tuple[Candidate, bytes]] = {}
        for start in range(0, len(fact_ids), 500):
            chunk = list(fact_ids[start : start + 500])
            for fid, content, trust, updated_at, blob in db.execute(
                "SELECT id, content, trust, updated_at, vector FROM facts"
                f" WHERE id IN ({_placeholders(len(chunk))}) AND owner IN ({_placeholders(len(owners))})",
                (*chunk, *owners),
            ):
                rows[fid] = (Candidate(fid, content, trust, updated_at), blob)
        found = [rows[i] for i in fact_ids if i in rows]
        codes = hrr.codes_from_blobs([b for _, b in found], self.dim)
        return [c for c, _ in found], codes

    def vectors(self, db: Conn, fact_ids: Sequence[int]) -> np.ndarray:
        """The vectors of ``fact_ids`` as rows, in the order given."""
        blobs: dict[int, bytes] = {}
        for start in range(0, len(fact_ids), 500):
            chunk = list(fact_ids[start : start + 500])
            rows = db.execute(
                f"SELECT id, vector FROM facts WHERE id IN ({_placeholders(len(chunk))})", chunk
            )
            blobs.update(rows.fetchall())
        return hrr.from_blobs([blobs[i] for i in fact_ids], self.dim)

    def banks(self, db: Conn, owners: Sequence[str]) -> list[tuple[str, str, int, np.ndarray]]:
        """(owner, category, fact_count, bundle vector) of every visible bank."""
        rows = db.execute(
            "SELECT owner, category, fact_count, phasor_sum FROM memory_banks WHERE owner IN"
            f" ({_placeholders(len(owners))})"
            " AND fact_count > 0 ORDER BY owner, category",
            tuple(owners),
        ).fetchall()
        return [(o, c, n, hrr.phase_of(hrr.phasor_from_blob(b))) for o, c, n, b in rows]

    def _bank_add(
        self, db: Conn, owner: str, category: str, phasor_delta: np.ndarray, count_delta: int
    ) -> None:
        row = db.execute(
            "SELECT fact_count, phasor_sum FROM memory_banks WHERE owner=? AND category=?", (owner, category)
        ).fetchone()
        if row is None:
            count, total = 0, np.zeros(self.dim, dtype=np.complex128)
        else:
            count, total = row[0], hrr.phasor_from_blob(row[1])
        count += count_delta
        if count <= 0:
            db.execute("DELETE FROM memory_banks WHERE owner=? AND category=?", (owner, category))
            return
        db.execute(
            self._SQL_PUT_BANK,
            (owner, category, count, hrr.phasor_to_blob(total + phasor_delta), self.clock()),
        )

    # --- the queries whose SQL is the backend's own --------------------------------
    def fts_ranks(
        self, db: Conn, terms: Sequence[str], owners: Sequence[str], category: str | None, limit: int
    ) -> dict[int, float]:
        """Full-text matches of any of ``terms`` among the owners' facts: id → rank,
        negative, the best match the most negative (bm25's convention)."""
        # The owner clause narrows the match set before bm25 ranks it; the exact
        # owner check in SQL stays, because two owners can tokenize alike.
        match = f"{{owner}} : ({fts_query(owners)}) AND {{content tags}} : ({fts_query(terms)})"
        sql = (
            "SELECT f.id, bm25(facts_fts, 1.0, 0.5, 0.0) FROM facts_fts JOIN facts f ON f.id = facts_fts.rowid"
            f" WHERE facts_fts MATCH ? AND f.owner IN ({_placeholders(len(owners))})"
        )
        params: list[object] = [match, *owners]
        if category is not None:
            sql += " AND f.category = ?"
            params.append(category)
        sql += " ORDER BY bm25(facts_fts, 1.0, 0.5, 0.0) LIMIT ?"
        params.append(limit)
        try:
            return {int(i): float(s) for i, s in db.execute(sql, params)}
        except sqlite3.OperationalError as e:
            # Quoting makes this unreachable for any input we know of; a new FTS5
            # edge case must cost this path, not the whole search.
            log.warning("fact search query rejected by FTS5", error=str(e))
            return {}

    def neighbours(
        self, db: Conn, entity_id: int, owners: Sequence[str], limit: int
    ) -> list[tuple[str, int, float, str]]:
        """(name, shared facts, summed trust, comma-separated fact ids) of the entities
        sharing visible facts with ``entity_id``, heaviest first."""
        return [
            tuple(r)
            for r in db.execute(
                f"SELECT e2.name, COUNT(*), SUM(f.trust), {self._SQL_ID_LIST} FROM fact_entities fe1"
                " JOIN facts f ON f.id = fe1.fact_id"
                " JOIN fact_entities fe2 ON fe2.fact_id = fe1.fact_id AND fe2.entity_id != fe1.entity_id"
                " JOIN entities e2 ON e2.id = fe2.entity_id"
                f" WHERE fe1.entity_id = ? AND f.owner IN ({_placeholders(len(owners))})"
                " GROUP BY e2.id ORDER BY SUM(f.trust) DESC, e2.name_lc LIMIT ?",
                (entity_id, *owners, limit),
            ).fetchall()
        ]

    _SQL_ID_LIST = "group_concat(f.id)"


MAX_QUERY_TERMS = 32


def _fact_of(row: Sequence[Any], entities: tuple[str, ...]) -> Fact:
    """A fact from a row of ``_FACT_COLUMNS``."""
    return Fact(
        id=row[0],
        owner=row[1],
        content=row[2],
        category=row[3],
        tags=row[4],
        source=row[5],
        trust=row[6],
        retrieval_count=row[7],
        helpful_count=row[8],
        created_at=row[9],
        updated_at=row[10],
        entities=entities,
    )


def fts_query(terms: Sequence[str]) -> str:
    """Quoted phrases OR-ed together: FTS5 syntax can never come from the user."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms[:MAX_QUERY_TERMS])


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    statements: list[str] = []
    buf: list[str] = []
    for line in script.splitlines():
        buf.append(line)
        candidate = "\n".join(buf).strip()
        if candidate and sqlite3.complete_statement(candidate):
            statements.append(candidate)
            buf = []
    tail = "\n".join(buf).strip()
    if tail:
        statements.append(tail)
    return statements
