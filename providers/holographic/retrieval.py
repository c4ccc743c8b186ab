"""Ranking facts: search, recall (prefetch), probe, related, reason, contradict.

Search never hands user text to the full-text engine as syntax (FTS5 on SQLite,
``tsvector`` on PostgreSQL, ``store.fts_ranks``): the query's content terms (stopwords
dropped) become quoted phrases joined by OR, so any string is safe and a sentence
finds facts matching *some* of its words. Candidates are the FTS matches plus the
facts linked to entities named in the query; each is scored

    score = (0.4·fts + 0.3·overlap + 0.3·(sim + 1)/2) · trust · decay

with ``fts`` the bm25 rank scaled to (0, 1], ``overlap`` the share of query terms the
fact contains, and ``sim`` the HRR similarity between the fact vector and a query
vector bundling the query's content key with its entities' keys — so a fact bound to
an entity in the question scores on that binding even when its words are common.
``decay`` is ½^(age / half-life) when a half-life is configured, else 1.

Contradictions are pairs that talk about the same entities (entity Jaccard ≥ 0.3) in
the same frame (the fact's words without its entity names and negations: HRR
similarity ≥ 0.5) but differ — in an entity ("lives in Paris" / "lives in Berlin") or
in negation ("drinks coffee" / "never drinks coffee"). The scan is capped at the most
recently updated facts, because it is quadratic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mnemo.providers.holographic import hrr
from mnemo.providers.holographic.entities import (
    NEGATIONS,
    content_terms,
    extract_entities,
    ngrams,
    normalize,
    words,
)
from mnemo.providers.holographic.store import Candidate, Conn, Fact, FactStore

W_FTS, W_OVERLAP, W_SIM = 0.4, 0.3, 0.3
DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class RetrievalSettings:
    min_trust: float = 0.3  # below this a fact is never recalled automatically
    half_life_days: float = 0.0  # 0: no decay
    candidates: int = 200  # per path (FTS, entities) before scoring
    contradict_scan: int = 500  # most recent facts compared pairwise


@dataclass(frozen=True, slots=True)
class Hit:
    fact: Fact
    score: float


@dataclass(frozen=True, slots=True)
class Neighbour:
    entity: str
    shared_facts: int
    weight: float  # summed trust of the linking facts
    fact_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Conflict:
    a: Fact
    b: Fact
    score: float
    entity_overlap: float
    frame_similarity: float


@dataclass(frozen=True, slots=True)
class CategoryHint:
    category: str
    similarity: float
    facts: int
    reliable: bool  # False once the bank holds more than its capacity estimate allows


class Retriever:
    def __init__(self, store: FactStore, settings: RetrievalSettings, clock: Callable[[], float]) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock

    # --- search and recall -------------------------------------------------------
    def search(
        self,
        query: str,
        owners: Sequence[str],
        limit: int,
        category: str | None = None,
        min_trust: float = 0.0,
    ) -> list[Hit]:
        terms = content_terms(query)
        with self.store.reading() as db:
            entities = self._query_entities(db, query, owners)
            fts = self._fts(db, terms, owners, category)
            linked = self._linked(db, [eid for eid, _ in entities], owners, category)
            ids = list(dict.fromkeys([*fts, *linked]))
            if not ids:
                return []
            cands, codes = self.store.candidates(db, ids, owners)
        parts = [hrr.entity_key(name, self.store.dim) for _, name in entities]
        key = hrr.content_key(terms, self.store.dim)
        if key is not None:
            parts.append(key)
        sims = hrr.code_similarities(codes, hrr.bundle(np.stack(parts))) if parts else np.zeros(len(cands))
        best = min(fts.values()) if fts else -1.0
        fts_part = np.array([fts[c.id] / best if c.id in fts and best < 0 else 0.0 for c in cands])
        wanted = set(terms)
        overlap = np.array(
            [len(wanted.intersection(words(c.content))) / len(wanted) if wanted else 0.0 for c in cands]
        )
        trust = np.array([c.trust for c in cands])
        scores = (
            (W_FTS * fts_part + W_OVERLAP * overlap + W_SIM * (sims + 1.0) / 2.0) * trust * self._decay(cands)
        )
        return self._top(cands, scores, limit, min_trust)

    def _top(
        self,
        cands: Sequence[Candidate],
        scores: np.ndarray,
        limit: int,
        min_trust: float,
        first: set[int] | None = None,
    ) -> list[Hit]:
        """The ``limit`` best candidates (those in ``first`` ahead of the rest), loaded whole."""
        order = sorted(
            (i for i, c in enumerate(cands) if c.trust >= min_trust),
            key=lambda i: (first is not None and cands[i].id not in first, -scores[i], -cands[i].id),
        )[:limit]
        with self.store.reading() as db:
            facts = {f.id: f for f in self.store.facts(db, [cands[i].id for i in order])}
        return [Hit(facts[cands[i].id], float(scores[i])) for i in order if cands[i].id in facts]

    def recall(self, query: str, owners: Sequence[str], limit: int) -> list[Hit]:
        """The prefetch path: search plus the best facts bound to each entity the
        query names, so entity facts never vanish behind common words."""
        min_trust = self.settings.min_trust
        hits = self.search(query, owners, limit, min_trust=min_trust)
        seen = {h.fact.id for h in hits}
        with self.store.reading() as db:
            entities = self._query_entities(db, query, owners)
        for _, name in entities[:3]:
            for hit in self.probe(name, owners, 2, min_trust=min_trust):
                if hit.fact.id not in seen:
                    seen.add(hit.fact.id)
                    hits.append(hit)
        return hits[: limit + 2]

    # --- entity actions ------------------------------------------------------------
    def probe(self, entity: str, owners: Sequence[str], limit: int, min_trust: float = 0.0) -> list[Hit]:
        """Every visible fact about ``entity``: facts linked to it first, then facts that
        mention it in their text; each group ranked by HRR binding × trust."""
        name = normalize(entity)
        if not name:
            return []
        with self.store.reading() as db:
            known = self.store.known_entities(db, [name.lower()], owners)
            linked = self._linked(db, [eid for eid, _ in known.values()], owners, None, cap=500)
            mentions = self._fts(db, [name], owners, None)
            cands, codes = self.store.candidates(db, list(dict.fromkeys([*linked, *mentions])), owners)
        if not cands:
            return []
        sims = hrr.code_similarities(codes, hrr.entity_key(name, self.store.dim))
        scores = (sims + 1.0) / 2.0 * np.array([c.trust for c in cands]) * self._decay(cands)
        return self._top(cands, scores, limit, min_trust, first=set(linked))

    def categories(self, entity: str, owners: Sequence[str]) -> list[CategoryHint]:
        """Which categories' banks carry ``entity`` (strongest first)."""
        key = hrr.entity_key(normalize(entity), self.store.dim)
        noise = 3.0 / math.sqrt(2.0 * self.store.dim)  # three spreads above chance
        best: dict[str, CategoryHint] = {}
        with self.store.reading() as db:
            banks = self.store.banks(db, owners)
        for _, category, count, vector in banks:
            sim = hrr.similarity(vector, key)
            if sim <= noise:
                continue
            hint = CategoryHint(
                category, round(sim, 4), count, not hrr.capacity_warning(self.store.dim, count)
            )
            if category not in best or hint.similarity > best[category].similarity:
                best[category] = hint
        return sorted(best.values(), key=lambda h: -h.similarity)

    def related(self, entity: str, owners: Sequence[str], limit: int) -> list[Neighbour]:
        """Entities sharing facts with ``entity``, weighted by those facts' trust."""
        name = normalize(entity)
        with self.store.reading() as db:
            known = self.store.known_entities(db, [name.lower()], owners)
            if not known:
                return []
            ((entity_id, _),) = known.values()
            rows = self.store.neighbours(db, entity_id, owners, limit)
        return [
            Neighbour(n, c, round(w, 4), tuple(sorted(int(i) for i in ids.split(","))))
            for n, c, w, ids in rows
        ]

    def reason(
        self, entities: Sequence[str], owners: Sequence[str], limit: int
    ) -> tuple[list[Hit], list[str]]:
        """Facts linked to *all* of ``entities``; also returns the names not known."""
        names = [n for n in dict.fromkeys(normalize(e) for e in entities) if n]
        with self.store.reading() as db:
            known = self.store.known_entities(db, [n.lower() for n in names], owners)
            unknown = [n for n in names if n.lower() not in known]
            if unknown or not names:
                return [], unknown
            ids = [eid for eid, _ in known.values()]
            rows = db.execute(
                "SELECT fe.fact_id FROM fact_entities fe JOIN facts f ON f.id = fe.fact_id"
                f" WHERE fe.entity_id IN ({','.join('?' * len(ids))}) AND f.owner IN ({','.join('?' * len(owners))})"
                " GROUP BY fe.fact_id HAVING COUNT(DISTINCT fe.entity_id) = ? LIMIT 500",
                (*ids, *owners, len(ids)),
            ).fetchall()
            cands, codes = self.store.candidates(db, [r[0] for r in rows], owners)
        if not cands:
            return [], []
        query = hrr.bundle(np.stack([hrr.entity_key(n, self.store.dim) for n in names]))
        scores = (hrr.code_similarities(codes, query) + 1.0) / 2.0 * np.array([c.trust for c in cands])
        return self._top(cands, scores, limit, 0.0), []

    def contradictions(self, owners: Sequence[str], limit: int) -> tuple[list[Conflict], int]:
        """Likely conflicting pairs among the most recent facts; also the number scanned."""
        with self.store.reading() as db:
            rows = db.execute(
                f"SELECT id FROM facts WHERE owner IN ({','.join('?' * len(owners))})"
                " ORDER BY updated_at DESC, id DESC LIMIT ?",
                (*owners, self.settings.contradict_scan),
            ).fetchall()
            facts = self.store.facts(db, [r[0] for r in rows], owners)
        n = len(facts)
        if n < 2:
            return [], n
        vocab = {e: i for i, e in enumerate(sorted({e.lower() for f in facts for e in f.entities}))}
        incidence = np.zeros((n, max(len(vocab), 1)), dtype=np.float32)
        for row, f in enumerate(facts):
            for e in f.entities:
                incidence[row, vocab[e.lower()]] = 1.0
        inter = incidence @ incidence.T
        sizes = incidence.sum(axis=1)
        union = sizes[:, None] + sizes[None, :] - inter
        jaccard = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        frames, negated = zip(*(_frame(f) for f in facts), strict=True)
        has_frame = np.array([bool(fr) for fr in frames])
        dim = self.store.dim
        frame_vecs = np.stack([_frame_vector(fr, dim) for fr in frames])
        frame_sim = hrr.similarity_matrix(frame_vecs, frame_vecs) * np.outer(has_frame, has_frame)
        neg = np.array(negated)
        differ = (inter < union) | (neg[:, None] != neg[None, :])
        score = jaccard * np.clip(frame_sim, 0.0, 1.0)
        mask = np.triu((jaccard >= 0.3) & (frame_sim >= 0.5) & differ, k=1)
        pairs = np.argwhere(mask)
        conflicts = [
            Conflict(
                facts[i],
                facts[j],
                round(float(score[i, j]), 4),
                round(float(jaccard[i, j]), 4),
                round(float(frame_sim[i, j]), 4),
            )
            for i, j in pairs
        ]
        conflicts.sort(key=lambda c: (-c.score, c.a.id, c.b.id))
        return conflicts[:limit], n

    # --- helpers -------------------------------------------------------------------
    def _query_entities(self, db: Conn, query: str, owners: Sequence[str]) -> list[tuple[int, str]]:
        keys = ngrams(query) | {e.lower() for e in extract_entities(query)}
        return sorted(self.store.known_entities(db, keys, owners).values(), key=lambda r: r[1].lower())

    def _fts(
        self, db: Conn, terms: Sequence[str], owners: Sequence[str], category: str | None
    ) -> dict[int, float]:
        if not terms:
            return {}
        return self.store.fts_ranks(db, terms, owners, category, self.settings.candidates)

    def _linked(
        self,
        db: Conn,
        entity_ids: Sequence[int],
        owners: Sequence[str],
        category: str | None,
        cap: int | None = None,
    ) -> list[int]:
        if not entity_ids:
            return []
        sql = (
            "SELECT f.id FROM facts f WHERE f.id IN (SELECT fe.fact_id FROM fact_entities fe"
            f" WHERE fe.entity_id IN ({','.join('?' * len(entity_ids))})) AND f.owner IN"
            f" ({','.join('?' * len(owners))})"
        )
        params: list[object] = [*entity_ids, *owners]
        if category is not None:
            sql += " AND f.category = ?"
            params.append(category)
        sql += " ORDER BY f.trust DESC, f.updated_at DESC, f.id DESC LIMIT ?"
        params.append(cap or self.settings.candidates)
        return [int(r[0]) for r in db.execute(sql, params)]

    def _decay(self, facts: Sequence[Candidate]) -> np.ndarray:
        if self.settings.half_life_days <= 0 or not facts:
            return np.ones(len(facts))
        age_days = np.maximum(0.0, self.clock() - np.array([f.updated_at for f in facts])) / DAY_S
        return np.power(0.5, age_days / self.settings.half_life_days)


def _frame(fact: Fact) -> tuple[list[str], bool]:
    """The fact's words without its entity names and negations, and whether it negates."""
    entity_words = {w for e in fact.entities for w in words(e)}
    all_words = words(fact.content)
    negated = any(w in NEGATIONS or w.endswith("n't") for w in all_words)
    frame = [w for w in content_terms(fact.content) if w not in entity_words and w not in NEGATIONS]
    return frame, negated


def _frame_vector(frame: Sequence[str], dim: int) -> np.ndarray:
    """A frame's vector; no words: the zero vector (similar to nothing)."""
    vector = hrr.encode_text(frame, dim) if frame else None
    return vector if vector is not None else np.zeros(dim)
