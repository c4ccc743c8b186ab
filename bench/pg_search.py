"""session_search on PostgreSQL vs SQLite: the same store, the same queries. Prints
figures; asserts nothing.

    python bench/pg_search.py [--messages 100000] [--chats 200] [--repeat 2] [--url postgresql://…]

Builds one dataset (``bench/session_store.py``'s generator: Zipf-distributed words plus
the development dataset's sentences, 60 messages a session, sessions in random chats)
into a SQLite ``state.db`` and into PostgreSQL (a throw-away cluster from
``tests/support/pgcluster.py`` unless ``--url`` names a database), both through their
real store's ``append_messages``. Then asks the dataset's questions in random chats
through ``SessionSearch`` (the gateway's default retriever) and ``PgSessionSearch`` and
reports p50/p95/p99, and how close the rankings are: the mean overlap of the two top-10s
(message ids are the same on both: the same rows in the same order).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.session_store import SYSTEM_PROMPT, TextGen, corpus, pct
from mnemo.gateway.storage import state_database
from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
from mnemo.memory.pg.db import PgDatabase
from mnemo.memory.pg.search import PgSessionSearch
from mnemo.memory.pg.sessions import PgSessionStore
from mnemo.memory.search import SessionSearch
from mnemo.memory.semantic import configured_retriever
from mnemo.memory.sessions import NewMessage, SessionStore


async def build(stores: list, total: int, chats: int) -> None:
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
            for store in stores:
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
        print(f"  built {done:,} messages in each store ({time.perf_counter() - t0:.0f} s)", flush=True)


async def timed(search, questions: list[str], keys: list[str], repeat: int) -> tuple[list[float], dict]:
    rng = random.Random(5)
    for q in questions[:20]:  # warm caches
        await search.search(q, chat_keys=[rng.choice(keys)], limit=10)
    rng = random.Random(7)
    times, tops = [], {}
    for r in range(repeat):
        for n, q in enumerate(questions):
            key = rng.choice(keys)
            t = time.perf_counter()
            result = await search.search(q, chat_keys=[key], limit=10)
            times.append((time.perf_counter() - t) * 1000)
            if r == 0:
                tops[n] = set(result.message_ids)
    return times, tops


async def run(total: int, chats: int, repeat: int, url: str | None) -> None:
    from tests.support.pgcluster import running_cluster

    with tempfile.TemporaryDirectory() as tmp, nullcontext(None) if url else running_cluster() as cluster:
        lite = state_database(Path(tmp) / "state.db")
        await lite.open()
        pg = PgDatabase(url or cluster.fresh_database(), migrations=PG_MIGRATIONS)
        await pg.open()
        print(f"building {total:,} messages over {chats} chats ...")
        await build([SessionStore(lite), PgSessionStore(pg)], total, chats)
        await pg.write(lambda c: c.execute("ANALYZE"))
        keys = [f"bench:dm:{n}" for n in range(chats)]
        _, questions = corpus()
        lite_times, lite_tops = await timed(
            SessionSearch(lite, retriever=configured_retriever(False)), questions, keys, repeat
        )
        pg_times, pg_tops = await timed(PgSessionSearch(pg), questions, keys, repeat)
        for name, times in (("sqlite", lite_times), ("postgresql", pg_times)):
            print(
                f"search {name:>10}: {len(times)} queries  p50 {pct(times, 50):.1f} ms  p95 {pct(times, 95):.1f} ms"
                f"  p99 {pct(times, 99):.1f} ms"
            )
        both = [n for n in lite_tops if lite_tops[n] or pg_tops[n]]
        overlap = [len(lite_tops[n] & pg_tops[n]) / max(len(lite_tops[n] | pg_tops[n]), 1) for n in both]
        top1 = sum(1 for n in both if lite_tops[n] and pg_tops[n] and lite_tops[n] & pg_tops[n])
        print(
            f"ranking: mean Jaccard overlap of the top-10s {sum(overlap) / max(len(overlap), 1):.2f}"
            f" over {len(both)} queries with hits; {top1} share at least one hit"
        )
        await pg.close()
        await lite.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--chats", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--url", help="an empty PostgreSQL database (default: a throw-away cluster)")
    args = ap.parse_args()
    asyncio.run(run(args.messages, args.chats, args.repeat, args.url))


if __name__ == "__main__":
    main()
