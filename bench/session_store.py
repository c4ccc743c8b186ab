"""Session store benchmarks: ingest rate and search latency. Prints figures; asserts nothing.

    python bench/session_store.py ingest [--messages 100000] [--lanes 1,8]
    python bench/session_store.py search [--messages 100000] [--chats 200] [--db PATH]

``ingest`` writes through the real async API (``SessionStore.append_messages``): one
transaction per message, the way the gateway persists a turn's messages as they
arrive — once from a single coroutine awaiting each write, once from several chats
(lanes) writing concurrently — and then in batches of 500 messages per transaction.
Targets on the 2-core reference machine: >= 5,000 messages/s one per transaction.

``search`` builds (or reuses, with ``--db``) a store of N messages spread over
``--chats`` chats (Zipf-distributed vocabulary plus the sentences of the development
dataset), then asks the dataset's 310 questions through ``SessionSearch`` in random
chats and reports p50/p95/p99 per retriever. ``--chats 1`` puts every message in one
chat (the worst case for scoping). Target: p95 <= 20 ms at 1M messages. Building 1M
messages takes a few minutes and ~1.5 GB of disk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from mnemo.gateway.storage import STATE_MIGRATIONS, state_database
from mnemo.memory.db import Database
from mnemo.memory.migrations import migrate
from mnemo.memory.ranking import (
    ContextRetriever,
    FusionRetriever,
    NaiveRetriever,
    create_baseline_index,
    create_legacy_index,
)
from mnemo.memory.search import SessionSearch
from mnemo.memory.sessions import NewMessage, SessionStore

DATA = Path(__file__).parent / "data"
# A realistic frozen system prompt (persona + MEMORY.md + USER.md + tool guidance):
# the session row it sits in is updated by every append (message counters).
SYSTEM_PROMPT = "You are mnemo, a helpful assistant. " * 230  # ~8 KB


def corpus() -> tuple[list[str], list[str]]:
    """Sentences and questions of the development dataset."""
    sentences, questions = [], []
    for p in sorted(DATA.glob("*.json")):
        d = json.loads(p.read_text(encoding="utf-8"))
        sentences += [m["content"] for s in d["sessions"] for m in s["messages"]]
        questions += [q["question"] for q in d["questions"]]
    return sentences, questions


class TextGen:
    """Chat-like text: dataset sentences, and Zipf-sampled words over a 30k vocabulary."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = np.random.default_rng(seed)
        self.sentences, _ = corpus()
        head = sorted({w.lower().strip(".,!?'") for s in self.sentences for w in s.split()} - {""})
        syll = [
            "ka",
            "lo",
            "mi",
            "ren",
            "to",
            "sa",
            "vel",
            "dor",
            "ni",
            "qua",
            "bri",
            "est",
            "um",
            "tar",
            "po",
        ]
        tail = {"".join(self.rng.choice(syll, size=self.rng.integers(2, 5))) for _ in range(40000)}
        self.vocab = np.array(head + sorted(tail - set(head)))
        ranks = np.arange(1, len(self.vocab) + 1)
        p = 1.0 / ranks**1.07
        self.p = p / p.sum()

    def batch(self, n: int) -> list[str]:
        out = []
        lengths = self.rng.integers(4, 40, size=n)
        words = self.rng.choice(len(self.vocab), size=int(lengths.sum()), p=self.p)
        at = 0
        for i in range(n):
            if self.rng.random() < 0.3:
                out.append(self.sentences[int(self.rng.integers(len(self.sentences)))])
            else:
                out.append(" ".join(self.vocab[words[at : at + lengths[i]]]))
            at += lengths[i]
        return out


async def new_session(store: SessionStore, chat: str, started: datetime | None = None) -> str:
    row = await store.create_session(
        chat_key=chat,
        platform="bench",
        chat_id=chat,
        thread_id=None,
        user_id="u",
        agent_context="primary",
        source="chat",
        model="bench",
        system_prompt=SYSTEM_PROMPT,
        started_at=started,
    )
    return row.id


def raw_reference(texts: list[str]) -> None:
    """Plain sqlite3 on the same schema, one transaction per message: this machine's ceiling now."""
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "state.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        migrate(conn, STATE_MIGRATIONS)
        conn.execute("INSERT INTO chats(id, chat_key) VALUES (1, 'raw')")
        conn.execute(
            "INSERT INTO sessions(id, chat_no, chat_key, platform, chat_id, agent_context, source, model,"
            " system_prompt, started_at) VALUES ('s', 1, 'raw', 'b', 'b', 'primary', 'chat', 'm', 'p', 'x')"
        )
        t = time.perf_counter()
        for x in texts:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO messages(session_id, chat_no, role, content, created_at) VALUES ('s', 1, 'user', ?,"
                " '2024-01-01T00:00:00.000000+00:00')",
                (x,),
            )
            conn.execute("COMMIT")
        dt = time.perf_counter() - t
        conn.close()
    print(
        f"reference: raw sqlite3, same schema and triggers, one transaction per message: {len(texts) / dt:,.0f} msgs/s"
    )


async def ingest(total: int, lanes_list: list[int]) -> None:
    gen = TextGen()
    texts = gen.batch(total)
    raw_reference(texts[: min(total, 20000)])
    # The schema before the contextual index (0008) first, on the same texts, for comparison.
    runs = [(1, "before 0008", STATE_MIGRATIONS[:7])] + [
        (lanes, "", STATE_MIGRATIONS) for lanes in lanes_list
    ]
    for lanes, label, migrations in runs:
        with tempfile.TemporaryDirectory() as tmp:
            db = Database(Path(tmp) / "state.db", migrations=migrations)
            await db.open()
            store = SessionStore(db)
            sessions = [await new_session(store, f"bench:dm:{i}") for i in range(lanes)]
            per_lane = total // lanes

            async def lane(i: int, sessions: list = sessions, per_lane: int = per_lane, store=store) -> None:
                sid = sessions[i]
                for j in range(per_lane):
                    role = "user" if j % 2 == 0 else "assistant"
                    await store.append_messages(sid, [NewMessage(role, texts[i * per_lane + j])])

            t = time.perf_counter()
            await asyncio.gather(*(lane(i) for i in range(lanes)))
            dt = time.perf_counter() - t
            n = per_lane * lanes
            print(
                f"ingest one transaction per message, {lanes}"
                f" lane(s){' ' + label if label else ''}: {n} msgs in {dt:.1f} s = {n / dt:,.0f} msgs/s"
                f" (busy retries {db.busy_retries})"
            )
            await db.close()
    with tempfile.TemporaryDirectory() as tmp:
        db = state_database(Path(tmp) / "state.db")
        await db.open()
        store = SessionStore(db)
        sid = await new_session(store, "bench:dm:batch")
        t = time.perf_counter()
        for i in range(0, total, 500):
            await store.append_messages(sid, [NewMessage("user", x) for x in texts[i : i + 500]])
        dt = time.perf_counter() - t
        print(f"ingest batched (500 per transaction): {total} msgs in {dt:.1f} s = {total / dt:,.0f} msgs/s")
        await db.close()


async def build(db: Database, total: int, chats: int) -> None:
    store = SessionStore(db)
    gen = TextGen()
    rng = random.Random(3)
    per_session = 60
    t0 = time.perf_counter()
    done = 0
    start = datetime(2022, 1, 1, tzinfo=UTC)
    while done < total:
        texts = gen.batch(min(20000, total - done))
        for i in range(0, len(texts), per_session):
            chat = f"bench:dm:{rng.randrange(chats)}"
            sid = await new_session(store, chat, start + timedelta(minutes=done // 10))
            chunk = texts[i : i + per_session]
            await store.append_messages(
                sid, [NewMessage("user" if k % 2 == 0 else "assistant", x) for k, x in enumerate(chunk)]
            )
            done += len(chunk)
        print(f"  built {done:,} messages ({done / (time.perf_counter() - t0):,.0f}/s)", flush=True)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def search_bench(total: int, chats: int, db_path: Path | None, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = db_path or Path(tmp) / "state.db"
        db = state_database(path)
        await db.open()
        existing = await db.read(lambda c: c.execute("SELECT count(*) FROM messages").fetchone()[0])
        if existing == 0:
            print(f"building {total:,} messages over {chats} chats at {path} ...")
            await build(db, total, chats)
            print("building the baseline's unstemmed index and the pre-0008 index ...")
            await db.write(create_baseline_index)
            await db.write(create_legacy_index)
        existing = await db.read(lambda c: c.execute("SELECT count(*) FROM messages").fetchone()[0])
        n_chats = await db.read(lambda c: c.execute("SELECT count(*) FROM chats").fetchone()[0])
        size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 1e6
        print(f"store: {existing:,} messages, {n_chats} chats, {size:,.0f} MB")
        _, questions = corpus()
        keys = await db.read(lambda c: [r[0] for r in c.execute("SELECT chat_key FROM chats")])
        rng = random.Random(5)
        for retriever in (NaiveRetriever(), FusionRetriever(name="fusion"), ContextRetriever()):
            search = SessionSearch(db, retriever=retriever)
            for q in questions[:20]:  # warm the page cache
                await search.search(q, chat_keys=[rng.choice(keys)], limit=10)
            times = []
            for _ in range(repeat):
                for q in questions:
                    key = rng.choice(keys)
                    t = time.perf_counter()
                    await search.search(q, chat_keys=[key], limit=10)
                    times.append((time.perf_counter() - t) * 1000)
            print(
                f"search {retriever.name:>8}: {len(times)} queries  p50 {pct(times, 50):.1f} ms"
                f"  p95 {pct(times, 95):.1f} ms  p99 {pct(times, 99):.1f} ms  max {max(times):.1f} ms"
            )
        await db.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("ingest")
    i.add_argument("--messages", type=int, default=100_000)
    i.add_argument("--lanes", default="1,8")
    s = sub.add_parser("search")
    s.add_argument("--messages", type=int, default=100_000)
    s.add_argument("--chats", type=int, default=200)
    s.add_argument("--db", type=Path, help="reuse (or build and keep) this database")
    s.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if args.cmd == "ingest":
        asyncio.run(ingest(args.messages, [int(x) for x in args.lanes.split(",")]))
    else:
        asyncio.run(search_bench(args.messages, args.chats, args.db, args.repeat))


if __name__ == "__main__":
    main()
