"""session_search on SQLite and PostgreSQL: the same stores, the same queries, in one run.
Prints figures; asserts nothing.

    python bench/pg_search.py [--messages 1000000] [--layouts 1,200] [--repeat 1]
                              [--keep DIR] [--url postgresql://…]

For each layout (``1``: every message in one chat, the worst case for scoping; ``200``:
spread over 200 chats) it builds one dataset (``bench/session_store.py``'s generator:
Zipf-distributed words plus the development dataset's sentences, 60 messages a
session) into a SQLite ``state.db`` through its real store's ``append_messages``, and
copies the same rows, ids included, into PostgreSQL with COPY (far faster than a second
pass through its store; message ids are the same on both). ``--keep DIR`` keeps the
stores (and the PostgreSQL cluster's data) in DIR and reuses them on the next run;
otherwise a throw-away cluster (``tests/support/pgcluster.py``) and temporary files
are used, or ``--url`` names an empty database.

Then it asks the development dataset's questions in random chats of the layout through
each backend's ``SessionSearch`` (the gateway's default retriever, ``limit=10``) and
reports p50/p95/p99 per backend, and how far the two rankings agree: the mean share of
one backend's top 10 that is in the other's top 10 (``|A ∩ B| / max(|A|, |B|)``) over
the questions where either finds something, and how often both put the same message
first. The same figures by text ("by text": the hits' texts, spacing and case folded)
count a repeated text as the same hit whichever copy each backend returns: the generator
draws 30% of its messages from a few thousand sentences, each then stored hundreds of
times, and both backends keep one copy of a repeated text. Target: p95 <= 20 ms at 1M
messages, overlap >= 0.8.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.session_store import SYSTEM_PROMPT, TextGen, corpus, pct
from mnemo.gateway.storage import state_database
from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
from mnemo.memory.pg.db import PgDatabase
from mnemo.memory.pg.search import PgSessionSearch
from mnemo.memory.search import SessionSearch
from mnemo.memory.sessions import NewMessage, SessionStore


async def count(db: Any) -> int:
    if isinstance(db, PgDatabase):

        async def q(conn: Any) -> int:
            row = await (await conn.execute("SELECT count(*) AS n FROM messages")).fetchone()
            return int(row["n"])

        return await db.read(q)
    return await db.read(lambda c: int(c.execute("SELECT count(*) FROM messages").fetchone()[0]))


async def build(store: SessionStore, total: int, chats: int) -> None:
    """``total`` messages in ``chats`` chats through the SQLite store's write path."""
    gen, rng = TextGen(), random.Random(3)
    start = datetime(2022, 1, 1, tzinfo=UTC)
    done, t0 = 0, time.perf_counter()
    while done < total:
        texts = gen.batch(min(20000, total - done))
        for i in range(0, len(texts), 60):
            chat = f"bench:dm:{rng.randrange(chats)}"
            chunk = [
                NewMessage("user" if k % 2 == 0 else "assistant", x) for k, x in enumerate(texts[i : i + 60])
            ]
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
                started_at=start + timedelta(minutes=done // 10),
            )
            await store.append_messages(row.id, chunk)
            done += len(chunk)
        print(f"  built {done:,} messages in SQLite ({time.perf_counter() - t0:.0f} s)", flush=True)


COPIED = {
    "chats": "id, chat_key",
    "sessions": "id, chat_no, chat_key, platform, chat_id, user_id, agent_context, source, model, system_prompt,"
    " started_at, message_count",
    "messages": "id, session_id, chat_no, role, content, author_name, created_at, meta, cjk",
}


def copy_rows(lite: Path, url: str) -> None:
    """The same rows, ids included, from the SQLite store into the PostgreSQL one (COPY:
    building both through the stores row by row took an hour for 1M messages)."""
    import sqlite3

    import psycopg

    t0 = time.perf_counter()
    src = sqlite3.connect(lite)
    with psycopg.connect(url) as conn:
        for table, columns in COPIED.items():
            with conn.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in src.execute(f"SELECT {columns} FROM {table} ORDER BY rowid"):
                    copy.write_row(row)
            print(f"  copied {table} to PostgreSQL ({time.perf_counter() - t0:.0f} s)", flush=True)
        for table in ("chats", "messages"):
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
            )
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
    src.close()


async def timed(
    search: Any, questions: list[str], keys: list[str], repeat: int
) -> tuple[list[float], dict, dict]:
    rng = random.Random(5)
    for q in questions[:20]:  # warm caches
        await search.search(q, chat_keys=[rng.choice(keys)], limit=10)
    rng = random.Random(7)
    times, tops, texts = [], {}, {}
    for r in range(repeat):
        for n, q in enumerate(questions):
            key = rng.choice(keys)
            t = time.perf_counter()
            result = await search.search(q, chat_keys=[key], limit=10)
            times.append((time.perf_counter() - t) * 1000)
            if r == 0:
                tops[n] = result.message_ids
                texts[n] = tuple(" ".join(h.content.lower().split()) for h in result.hits)
    return times, tops, texts


def agreement(a: dict[int, tuple[Any, ...]], b: dict[int, tuple[Any, ...]]) -> tuple[float, float, int]:
    """(mean top-10 overlap, share with the same first hit, questions compared)."""
    both = [n for n in a if a[n] or b[n]]
    overlap = [len(set(a[n]) & set(b[n])) / max(len(a[n]), len(b[n])) for n in both]
    first = [1.0 if a[n] and b[n] and a[n][0] == b[n][0] else 0.0 for n in both]
    return sum(overlap) / max(len(both), 1), sum(first) / max(len(both), 1), len(both)


def persistent_cluster(root: Path) -> Any:
    """A cluster kept in ``root`` between runs (initdb once)."""
    import os
    import shutil

    from tests.support.pgcluster import Cluster, find_bindir

    bindir = find_bindir()
    assert bindir is not None, "PostgreSQL binaries not found"
    user = "postgres" if os.geteuid() == 0 else None
    root.mkdir(parents=True, exist_ok=True)
    if user is not None:
        shutil.chown(root, user)
    cluster = Cluster(root, bindir, user)
    if (root / "data").exists():
        options = f"-k {root} -c listen_addresses='' -c fsync=off -c synchronous_commit=off"
        cluster._run(  # a kept cluster is started again, not initialised
            "pg_ctl", "-D", str(root / "data"), "-o", options, "-l", str(root / "server.log"), "-w", "start"
        )
    else:
        cluster.start()
    return cluster


async def pg_database(cluster: Any, url: str | None, name: str) -> str:
    if url:
        return url
    import psycopg

    async with await psycopg.AsyncConnection.connect(cluster.url(), autocommit=True) as conn:
        row = await (await conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))).fetchone()
        if row is None:
            await conn.execute(f'CREATE DATABASE "{name}"')
    return str(cluster.url(name))


async def run(total: int, layouts: list[int], repeat: int, url: str | None, keep: Path | None) -> None:
    from tests.support.pgcluster import running_cluster

    with ExitStack() as stack:
        folder = keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if url:
            cluster = None
        elif keep:
            cluster = persistent_cluster(keep / "pg")
            stack.callback(cluster.stop)
        else:
            cluster = stack.enter_context(running_cluster())
        _, questions = corpus()
        for chats in layouts:
            lite = state_database(folder / f"lite_{total}_{chats}.db")
            await lite.open()
            pg = PgDatabase(
                await pg_database(cluster, url, f"bench_{total}_{chats}"), migrations=PG_MIGRATIONS
            )
            await pg.open()
            have = [await count(lite), await count(pg)]
            if have != [total, total]:
                if have[1] or have[0] not in (0, total):
                    raise SystemExit(f"{folder}: stores for {chats} chats hold {have} messages; remove them")
                print(f"building {total:,} messages over {chats} chat(s) ...", flush=True)
                if not have[0]:
                    await build(SessionStore(lite), total, chats)
                await asyncio.to_thread(copy_rows, lite.path, pg.url)
            keys = [f"bench:dm:{n}" for n in range(chats)]
            lite_times, lite_tops, lite_texts = await timed(SessionSearch(lite), questions, keys, repeat)
            pg_times, pg_tops, pg_texts = await timed(PgSessionSearch(pg), questions, keys, repeat)
            print(f"{total:,} messages in {chats} chat(s):")
            for name, times in (("sqlite", lite_times), ("postgresql", pg_times)):
                print(
                    f"  search {name:>10}: {len(times)} queries  p50 {pct(times, 50):.1f} ms"
                    f"  p95 {pct(times, 95):.1f} ms  p99 {pct(times, 99):.1f} ms"
                )
            overlap, first, n = agreement(lite_tops, pg_tops)
            print(
                f"  ranking: top-10 overlap {overlap:.2f}, same first hit {first:.2f} over {n} queries",
                flush=True,
            )
            overlap, first, n = agreement(lite_texts, pg_texts)
            print(f"  by text: top-10 overlap {overlap:.2f}, same first hit {first:.2f}", flush=True)
            await pg.close()
            await lite.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--layouts", default="1,200", help="chats per store, comma-separated (default 1,200)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--url", help="an empty PostgreSQL database (default: a throw-away cluster)")
    ap.add_argument(
        "--keep", type=Path, help="keep the stores (and the cluster) in this folder and reuse them"
    )
    args = ap.parse_args()
    layouts = [int(x) for x in args.layouts.split(",") if x.strip()]
    if args.url and len(layouts) > 1:
        raise SystemExit("--url holds one store: give one layout")
    asyncio.run(run(args.messages, layouts, args.repeat, args.url, args.keep))


if __name__ == "__main__":
    main()
