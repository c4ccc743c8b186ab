"""Holographic provider benchmarks. Prints figures; asserts nothing.

    python bench/holographic.py latency  [--facts 10000,100000] [--users 50] [--queries 300] [--dim 1024]
    python bench/holographic.py capacity [--dims 1024,4096] [--sizes 16,32,...] [--candidates 1000]
    python bench/holographic.py          (both, default arguments)

``latency`` fills a fresh facts.db with N synthetic facts (people, organisations and
places drawn from fixed name lists, a few verbs and objects; spread over ``--users``
chat users plus 10 % shared facts) in batches of 1,000 per transaction, then runs
``--queries`` calls of each kind through ``HolographicProvider.handle_tool_call`` — the
model's own path, JSON included — for a random user each time:
``search`` with a natural-language question naming one person and a topic, ``probe``
of one person, and ``prefetch`` of the question. Reports insert rate and p50/p95/p99.

``capacity`` bundles ``n`` bound key/value pairs at each dimension, unbinds every key,
and counts how often the nearest of ``--candidates`` codebook vectors is the right
value, next to ``hrr.expected_recall`` (the prediction from ``capacity_snr``) and to
the measured signal-to-noise ratio.

Seeded: the same arguments give the same data on every machine.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.providers.holographic import HolographicProvider, hrr
from mnemo.providers.holographic.store import SHARED, NewFact

SYLLABLES = "ka lo mi ra ve no sa tu be li ro da fe ni zu po".split()
VERBS = ["works at", "lives near", "met", "manages", "recommended", "visited", "prefers", "reported on"]
OBJECTS = [
    "the billing service", "the quarterly budget", "green tea", "the staging cluster", "a vegan restaurant",
    "the onboarding guide", "weekly standups", "the mobile app", "the hiring plan", "dark mode",
]  # fmt: skip
TOPICS = ["budget", "billing", "standups", "tea", "cluster", "restaurant", "hiring", "app"]


def names(rng: random.Random, count: int, parts: int) -> list[str]:
    out: set[str] = set()
    while len(out) < count:
        out.add("".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize())
    return sorted(out)


def percentiles(samples: list[float]) -> str:
    q = np.percentile(np.array(samples) * 1000.0, [50, 95, 99])
    return f"p50 {q[0]:7.2f} ms   p95 {q[1]:7.2f} ms   p99 {q[2]:7.2f} ms"


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def latency(n_facts: int, users: int, queries: int, dim: int) -> None:
    rng = random.Random(n_facts)
    people = names(rng, max(200, n_facts // 50), 3)
    orgs = names(rng, 100, 2)
    places = names(rng, 60, 2)
    owners = [f"telegram:{i}" for i in range(users)]
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        provider = HolographicProvider()
        provider.initialize(home, {"dim": dim})
        store = provider.store
        assert store is not None
        start = time.perf_counter()
        batch: list[NewFact] = []
        for i in range(n_facts):
            owner = SHARED if rng.random() < 0.1 else rng.choice(owners)
            person = rng.choice(people)
            tail = rng.choice([rng.choice(orgs), rng.choice(places), rng.choice(OBJECTS)])
            text = f"{person} {rng.choice(VERBS)} {tail} ({i})."
            batch.append(NewFact(owner, text, rng.choice(["general", "work", "personal"])))
            if len(batch) == 1000:
                store.add_many(batch)
                batch = []
        if batch:
            store.add_many(batch)
        elapsed = time.perf_counter() - start
        with store.reading() as db:
            # Steady state: facts arrive a few at a time and auto-checkpoints keep the
            # WAL short; after a bulk load it is long until checkpointed.
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        size_mb = (home / "providers" / "holographic" / "facts.db").stat().st_size / 1e6
        print(
            f"\n{n_facts:,} facts, dim {dim}: inserted in {elapsed:.1f} s ({n_facts / elapsed:,.0f}"
            f" facts/s), db {size_mb:.0f} MB"
        )

        def ctx() -> ProviderContext:
            user = UserRef.parse(rng.choice(owners))
            return ProviderContext("bench", f"chat-{user}", user.platform, user, AgentContext.PRIMARY, home)

        def question() -> str:
            return f"What do we know about {rng.choice(people)} and the {rng.choice(TOPICS)}?"

        search = timed(
            lambda: provider.handle_tool_call("fact_store", {"action": "search", "query": question()}, ctx()),
            queries,
        )
        probe = timed(
            lambda: provider.handle_tool_call(
                "fact_store", {"action": "probe", "entity": rng.choice(people)}, ctx()
            ),
            queries,
        )
        prefetch = timed(lambda: provider.prefetch(question(), ctx()), queries)
        print(f"  search   {percentiles(search)}")
        print(f"  probe    {percentiles(probe)}")
        print(f"  prefetch {percentiles(prefetch)}")
        provider.shutdown()


def measured(dim: int, n: int, candidates: int) -> tuple[float, float]:
    """(accuracy, measured SNR) for a bundle of ``n`` pairs."""
    keys = hrr.atoms([f"key-{i}" for i in range(n)], dim)
    values = hrr.atoms([f"value-{i}" for i in range(max(n, candidates))], dim)
    memory = hrr.bundle(hrr.bind(keys, values[:n]))
    sims = hrr.similarity_matrix(hrr.unbind(memory[None, :], keys), values)
    accuracy = float((sims.argmax(axis=1) == np.arange(n)).mean())
    right = sims[np.arange(n), np.arange(n)]
    wrong = sims[:, n:] if values.shape[0] > n else sims[~np.eye(n, dtype=bool)].reshape(n, -1)
    return accuracy, float(right.mean() / wrong.std())


def capacity(dims: list[int], sizes: list[int], candidates: int) -> None:
    print(f"\nHRR recall vs bundle size (nearest of {candidates} candidates, all n keys queried)")
    print(f"{'dim':>5} {'n':>5} {'est SNR':>8} {'meas SNR':>9} {'predicted':>10} {'measured':>9} {'warn':>5}")
    for dim in dims:
        for n in sizes:
            acc, snr = measured(dim, n, candidates)
            predicted = hrr.expected_recall(dim, n, max(n, candidates))
            warn = "yes" if hrr.capacity_warning(dim, n) else ""
            print(
                f"{dim:>5} {n:>5} {hrr.capacity_snr(dim, n):>8.2f} {snr:>9.2f} {predicted:>10.3f} {acc:>9.3f} {warn:>5}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", nargs="?", choices=("latency", "capacity", "all"), default="all")
    parser.add_argument("--facts", default="10000,100000")
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--dim", type=int, default=hrr.DEFAULT_DIM)
    parser.add_argument("--dims", default="1024,4096")
    parser.add_argument("--sizes", default="16,32,64,128,256,512,1024,2048")
    parser.add_argument("--candidates", type=int, default=1000)
    args = parser.parse_args()
    if args.what in ("capacity", "all"):
        capacity(
            [int(d) for d in args.dims.split(",")], [int(n) for n in args.sizes.split(",")], args.candidates
        )
    if args.what in ("latency", "all"):
        for n in (int(x) for x in args.facts.split(",")):
            latency(n, args.users, args.queries, args.dim)


if __name__ == "__main__":
    main()
