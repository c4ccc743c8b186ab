"""Throughput of the curated memory store (``memory/curated.py``).

    python bench/memory_store.py [--ops 1000] [--procs 4] [--dir /some/disk]

Every operation is the real thing: take the ``flock``, re-read and parse the whole file,
apply the change, write a temp file, fsync it, rename it over the old one, fsync the
folder. Two runs on a fresh temporary home:

* 1 process doing ``--ops`` adds, then ``--ops`` replaces;
* ``--procs`` processes on the *same* file, ``--ops / procs`` adds each, then as many
  replaces each (a barrier separates the phases), so they contend for the lock.

The limit is raised so no add is refused; the file grows to ``--ops`` entries (~70
chars each), which is far past what a real 2,200-char MEMORY.md holds, so these are
conservative figures. Prints ops/s and the per-operation latency percentiles.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from mnemo.memory.curated import MemoryFiles

ENTRY_PAD = "x" * 40


def _entry(proc: int, i: int, suffix: str = "") -> str:
    return f"bench process {proc} entry {i:05d} {suffix}{ENTRY_PAD}"


def _worker(memories: str, proc: int, n: int, barrier: Any, out: Any) -> None:
    f = MemoryFiles(Path(memories), memory_limit=10_000_000, lock_timeout=300).shared()
    lat_add, lat_rep = [], []
    barrier.wait()
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter()
        if not f.add(_entry(proc, i)).success:
            raise SystemExit(f"add refused in process {proc}")
        lat_add.append(time.perf_counter() - s)
    t1 = time.perf_counter()
    barrier.wait()
    t2 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter()
        if not f.replace(f"process {proc} entry {i:05d} ", _entry(proc, i, "replaced ")).success:
            raise SystemExit(f"replace refused in process {proc}")
        lat_rep.append(time.perf_counter() - s)
    t3 = time.perf_counter()
    out.put((t0, t1, t2, t3, lat_add, lat_rep))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(procs: int, ops: int, base: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    memories = Path(tempfile.mkdtemp(prefix="mnemo-bench-", dir=base)) / "memories"
    per = ops // procs
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(str(memories), p, per, barrier, out)) for p in range(procs)]
    for w in workers:
        w.start()
    results = [out.get() for _ in workers]
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise SystemExit(f"a worker failed (exit {w.exitcode})")
    add_wall = max(r[1] for r in results) - min(r[0] for r in results)
    rep_wall = max(r[3] for r in results) - min(r[2] for r in results)
    lat_add = [x for r in results for x in r[4]]
    lat_rep = [x for r in results for x in r[5]]
    total = per * procs
    size = (memories / "MEMORY.md").stat().st_size
    label = f"{procs} process{'es' if procs > 1 else ''}"
    for name, wall, lat in (("add", add_wall, lat_add), ("replace", rep_wall, lat_rep)):
        print(
            f"{label:<12} {name:<8} {total:>6} ops  {total / wall:>8.0f} ops/s   "
            f"latency p50 {_pct(lat, 0.5) * 1000:6.2f} ms  p99 {_pct(lat, 0.99) * 1000:6.2f} ms  "
            f"mean {statistics.fmean(lat) * 1000:6.2f} ms"
        )
    print(f"{'':<12} final file {size:,} bytes, {total} entries")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1000, help="adds (and replaces) per run, in total")
    parser.add_argument("--procs", type=int, default=4, help="contending processes in the second run")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the temporary home goes (default: $TMPDIR)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-", dir=args.dir) as base:
        run(1, args.ops, Path(base))
        run(args.procs, args.ops, Path(base))


if __name__ == "__main__":
    main()
