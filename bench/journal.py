"""What the memory journal costs per memory write (``memory/journal.py``). Prints
figures; asserts nothing.

    python bench/journal.py [--ops 300] [--url postgresql://…] [--no-pg]

The same curated writes (add, then replace of each entry, on a MEMORY.md kept at a
realistic ~1-2 KB by removing the oldest entry) with and without the journal:

* SQLite: ``MemoryFiles`` without a journal, then with ``SqliteJournal`` on a
  ``state.db`` (stage → file write → commit: two ``state.db`` commits and one read per
  write, on top of the file's fsyncs);
* PostgreSQL: ``PgCuratedFiles(journaled=False)`` then ``journaled=True`` (the entry in
  the row's own transaction), on a throw-away cluster (``tests/support/pgcluster.py``)
  unless ``--url`` names a database.

Reports p50/p95 per write and the difference the journal makes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnemo.gateway.storage import state_database
from mnemo.memory.curated import MemoryFiles, WriteResult
from mnemo.memory.journal import Actor, Provenance, Trust
from mnemo.memory.journal_sqlite import SqliteJournal
from mnemo.memory.ports import CuratedDocument
from mnemo.memory.scope import UserRef

BY = Provenance(Actor.MODEL, Trust.STATED, speaker="telegram:1", session="s", message="m", chat="c")
KEEP = 20  # entries kept: ~20 x 60 chars, a full MEMORY.md


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def workload(docs: dict[str, CuratedDocument], ops: int) -> dict[str, list[float]]:
    """Seconds per write for each document: ``ops`` adds, each followed by a replace,
    the oldest entry removed past ``KEEP``. The documents take turns write by write, so
    a slow moment of the shared disk falls on both alike."""
    times: dict[str, list[float]] = {name: [] for name in docs}

    def timed(name: str, write: Callable[[], WriteResult]) -> None:
        start = time.perf_counter()
        result = write()
        times[name].append(time.perf_counter() - start)
        if not result.success:
            raise SystemExit(result.message)

    for i in range(ops):
        note = f"note {i:05d}:"
        for name, doc in docs.items():
            timed(name, partial(doc.add, f"{note} the deploy window is Tuesday 14:00 UTC", BY))
        for name, doc in docs.items():
            timed(name, partial(doc.replace, note, f"{note} the deploy window is Wednesday 10:00 UTC", BY))
        for doc in docs.values():
            entries = doc.load().entries
            if len(entries) > KEEP:
                doc.remove(entries[0], BY)
    return times


def report(name: str, plain: list[float], journaled: list[float]) -> None:
    def ms(v: float) -> str:
        return f"{v * 1000:.2f} ms"

    print(f"{name}: {len(plain)} writes each")
    for label, t in (("without journal", plain), ("with journal", journaled)):
        print(f"  {label:16} p50 {ms(pct(t, 0.5))}  p95 {ms(pct(t, 0.95))}  mean {ms(statistics.fmean(t))}")
    print(
        f"  journal overhead p50 {ms(pct(journaled, 0.5) - pct(plain, 0.5))}"
        f"  mean {ms(statistics.fmean(journaled) - statistics.fmean(plain))}"
    )


def sqlite(ops: int) -> None:
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-journal-") as tmp:
        root = Path(tmp)
        db = state_database(root / "state.db")
        db.open_sync()
        try:
            plain = MemoryFiles(root / "plain", memory_limit=10_000).shared()
            journaled = MemoryFiles(
                root / "journaled", memory_limit=10_000, journal=SqliteJournal(db)
            ).shared()
            times = workload({"plain": plain, "journaled": journaled}, ops)
        finally:
            db.close_sync()
        report("SQLite (files + state.db)", times["plain"], times["journaled"])


@contextmanager
def database(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from tests.support.pgcluster import running_cluster

    with running_cluster() as cluster:
        yield cluster.fresh_database()


def postgresql(ops: int, url: str | None) -> None:
    import asyncio

    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.memory.pg.curated import PgCuratedFiles
    from mnemo.memory.pg.db import PgDatabase

    with database(url) as where:

        async def migrate() -> None:
            db = PgDatabase(where, migrations=PG_MIGRATIONS, max_size=1)
            await db.open()
            await db.close()

        asyncio.run(migrate())
        # Two rows: MEMORY.md unjournaled, one USER.md journaled (the same statements).
        plain = PgCuratedFiles(where, memory_limit=10_000, user_limit=10_000, journaled=False)
        journaled = PgCuratedFiles(where, memory_limit=10_000, user_limit=10_000, journaled=True)
        try:
            docs = {"plain": plain.shared(), "journaled": journaled.user(UserRef("telegram", "1"))}
            times = workload(docs, ops)
        finally:
            plain.close()
            journaled.close()
        report("PostgreSQL (rows)", times["plain"], times["journaled"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300, help="adds (each followed by a replace)")
    parser.add_argument("--url", help="a PostgreSQL database to use instead of a throw-away cluster")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)
    sqlite(args.ops)
    if not args.no_pg:
        postgresql(args.ops, args.url)


if __name__ == "__main__":
    main()
