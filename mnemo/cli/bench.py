"""``mnemo bench recall``: how often session_search finds the evidence of a question.

Every dataset file (``memory/dataset.py`` format; a folder means its ``*.json``) is
imported as its own chat into a fresh temporary profile, through the real write path.
Each question with evidence is asked in its own chat's scope through
``SessionSearch``, once with the naive baseline (raw words OR-ed, unicode61, bm25)
and once with the shipped retriever, in the same run on the same database. The table
shows recall@k and any-hit@k per file, per category and overall; with ``--json`` the
last line is ``{"baseline": {"recall@K": …, "any_hit@K": …}, "shipped": {…}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnemo.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.dataset import QuestionOutcome, ask_questions, dataset_files, import_dataset, load_dataset, summarize
from mnemo.gateway.storage import state_database
from mnemo.memory.errors import InvalidDataset
from mnemo.memory.ranking import FusionRetriever, NaiveRetriever, Retriever, create_baseline_index
from mnemo.memory.search import SessionSearch
from mnemo.memory.sessions import SessionStore


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", help="reproducible benchmarks", description="Reproducible benchmarks.")
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)
    recall = sub.add_parser("recall", help="recall@k of session_search on datasets (baseline vs shipped)")
    recall.add_argument("--dataset", metavar="PATH", type=Path, action="append", required=True,
                        help="a dataset file or a folder of them (repeatable)")
    recall.add_argument("--k", default="1,5,10,20", metavar="K,K,...", help="cut-offs (default 1,5,10,20)")
    recall.add_argument("--json", action="store_true", help="end with one JSON line of the overall scores")
    recall.set_defaults(handler=_recall)


def parse_ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(p) for p in text.split(",") if p.strip()}))
    except ValueError:
        raise CommandError(f"--k: expected comma-separated whole numbers, got {text!r}", EXIT_USAGE) from None
    if not ks or ks[0] < 1:
        raise CommandError("--k: cut-offs must be whole numbers of at least 1", EXIT_USAGE)
    return ks


@dataclass(frozen=True, slots=True)
class RecallRun:
    files: tuple[str, ...]
    outcomes: dict[str, dict[str, list[QuestionOutcome]]]  # retriever -> file -> outcomes


RETRIEVERS: tuple[Retriever, ...] = (NaiveRetriever(), FusionRetriever())


async def run_recall(paths: Sequence[Path], ks: Sequence[int], home: Path) -> RecallRun:
    files = dataset_files(paths)
    datasets = [load_dataset(p) for p in files]
    db = state_database(home / "state.db")
    await db.open()
    try:
        store = SessionStore(db)
        reports = []
        for i, ds in enumerate(datasets):
            reports.append(await import_dataset(store, ds, f"bench:{i}:{ds.name}"))
        await db.write(create_baseline_index)
        outcomes: dict[str, dict[str, list[QuestionOutcome]]] = {}
        for retriever in RETRIEVERS:
            search = SessionSearch(db, retriever=retriever)
            per_file = outcomes.setdefault(retriever.name, {})
            for ds, report in zip(datasets, reports, strict=True):
                per_file[ds.name] = await ask_questions(search, ds, report, max(ks))
        return RecallRun(tuple(ds.name for ds in datasets), outcomes)
    finally:
        await db.close()


def _row(label: str, n: int, base: dict[str, float], shipped: dict[str, float], ks: Sequence[int]) -> str:
    cells = []
    for k in ks:
        b, s = base[f"recall@{k}"], shipped[f"recall@{k}"]
        cells.append(f"{b:6.3f} {s:6.3f}")
    return f"{label:<24} {n:>5}  " + "  ".join(cells)


def render(run: RecallRun, ks: Sequence[int]) -> list[str]:
    base, shipped = run.outcomes["baseline"], run.outcomes["shipped"]
    head = f"{'recall@k (base  shipped)':<24} {'qs':>5}  " + "  ".join(f"{'@' + str(k):>13}" for k in ks)
    lines = [head, "-" * len(head)]
    for name in run.files:
        lines.append(_row(name, len(base[name]), summarize(base[name], ks), summarize(shipped[name], ks), ks))
    all_b = [o for name in run.files for o in base[name]]
    all_s = [o for name in run.files for o in shipped[name]]
    for cat in sorted({o.category or "-" for o in all_b}):
        cb = [o for o in all_b if (o.category or "-") == cat]
        cs = [o for o in all_s if (o.category or "-") == cat]
        lines.append(_row(f"[{cat}]", len(cb), summarize(cb, ks), summarize(cs, ks), ks))
    sb, ss = summarize(all_b, ks), summarize(all_s, ks)
    lines.append(_row("ALL", len(all_b), sb, ss, ks))
    lines.append(
        "any_hit@k (base shipped)       "
        + "  ".join(f"@{k}: {sb[f'any_hit@{k}']:.3f} {ss[f'any_hit@{k}']:.3f}" for k in ks)
    )
    for k in ks:
        if sb[f"recall@{k}"] > 0:
            lines.append(f"shipped / baseline recall@{k}: {ss[f'recall@{k}'] / sb[f'recall@{k}']:.2f}x")
    return lines


def overall(run: RecallRun, ks: Sequence[int]) -> dict[str, dict[str, float]]:
    out = {}
    for name, per_file in run.outcomes.items():
        scores = summarize([o for f in run.files for o in per_file[f]], ks)
        out[name] = {k: round(v, 4) for k, v in scores.items()}
    return out


def _recall(args: argparse.Namespace, settings: Settings) -> int:
    ks = parse_ks(args.k)
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-") as tmp:
        try:
            run = asyncio.run(run_recall(args.dataset, ks, Path(tmp)))
        except InvalidDataset as e:
            raise CommandError(str(e), EXIT_USAGE) from e
    for line in render(run, ks):
        print(line)
    if args.json:
        print(json.dumps(overall(run, ks)))
    sys.stdout.flush()
    return EXIT_OK
