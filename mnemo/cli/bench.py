"""``mnemo bench recall``: how often session_search finds the evidence of a question.

Every dataset file (``memory/dataset.py`` format; a folder means its ``*.json``) is
imported as its own chat into a fresh temporary profile, through the real write path,
in timeline order: a question placed on the timeline (``asked_in``) is asked when
exactly the sessions before it are stored. Each question with evidence is asked in its
own chat's scope through ``SessionSearch``, once with the naive baseline (raw words
OR-ed, unicode61, bm25) and once with the shipped retriever, in the same run on the
same database. The table shows recall@k per file, per category and overall, then
any-hit@k and the session-level recall (a session counts as found when one of its
messages is in the top k).

``--as-tool`` also asks each question through the ``session_search`` tool itself, with
this profile's ``search`` settings (the defaults in a fresh profile), and reports
``seen``: the share of evidence messages present anywhere in the text the model
receives (matches and the turns shown around them), and the size of that text in
tokens (median and 95th percentile). With ``--json`` the last line is
``{"baseline": {"recall@K": …, "any_hit@K": …, "session_recall@K": …[, "seen": …,
"tokens_median": …, "tokens_p95": …]}, "shipped": {…}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnemo.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.gateway.storage import state_database
from mnemo.memory.dataset import (
    AskTool,
    DatasetImport,
    QuestionOutcome,
    ToolAnswer,
    ask_questions,
    dataset_files,
    load_dataset,
    summarize,
    timeline,
)
from mnemo.memory.errors import InvalidDataset
from mnemo.memory.ranking import (
    ContextRetriever,
    FusionRetriever,
    NaiveRetriever,
    Retriever,
    create_baseline_index,
    create_legacy_index,
)
from mnemo.memory.search import SessionSearch
from mnemo.memory.sessions import SessionStore


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="reproducible benchmarks", description="Reproducible benchmarks."
    )
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)
    recall = sub.add_parser("recall", help="recall@k of session_search on datasets (baseline vs shipped)")
    recall.add_argument(
        "--dataset",
        metavar="PATH",
        type=Path,
        action="append",
        required=True,
        help="a dataset file or a folder of them (repeatable)",
    )
    recall.add_argument("--k", default="1,5,10,20", metavar="K,K,...", help="cut-offs (default 1,5,10,20)")
    recall.add_argument("--json", action="store_true", help="end with one JSON line of the overall scores")
    recall.add_argument(
        "--as-tool",
        action="store_true",
        help="also measure what the session_search tool shows the model: seen (evidence present) and tokens",
    )
    recall.add_argument(
        "--retriever",
        metavar="NAME",
        action="append",
        default=[],
        choices=RETRIEVER_NAMES,
        help="also measure this retriever (repeatable): " + ", ".join(RETRIEVER_NAMES),
    )
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


RETRIEVER_NAMES = ("baseline", "fusion", "contextual", "semantic", "semantic-hash")


def make_retriever(name: str) -> Retriever:
    """A retriever by its benchmark name (``semantic`` needs the extra)."""
    from mnemo.memory.semantic import HashEmbedder, SemanticRetriever, load_embedder  # numpy: only when used

    if name == "baseline":
        return NaiveRetriever()
    if name == "fusion":  # the default before the contextual index (0008)
        return FusionRetriever(name="fusion")
    if name == "contextual":
        return ContextRetriever()
    if name == "semantic":
        return SemanticRetriever(load_embedder())
    if name == "semantic-hash":
        return SemanticRetriever(HashEmbedder(), name="semantic-hash")
    raise CommandError(f"--retriever: unknown {name!r} (one of {', '.join(RETRIEVER_NAMES)})", EXIT_USAGE)


def shipped_name(settings: Settings | None) -> str:
    """What session_search uses with this configuration."""
    from mnemo.memory.semantic import SemanticUnavailable, load_embedder

    if settings is not None and settings.search.semantic:
        try:
            load_embedder()
        except SemanticUnavailable as e:
            print(f"note: {e}; 'shipped' is the contextual retriever", file=sys.stderr)
            return "contextual"
        return "semantic"
    return "contextual"


def tool_asker(search: SessionSearch, settings: Settings) -> AskTool:
    """Ask a question the way the model does: through the ``session_search`` tool with
    this profile's settings; what it showed and how large it was."""
    from mnemo.gateway.turns.builtin_tools import search_view_settings
    from mnemo.memory.search_tool import run_session_search_tool
    from mnemo.memory.tokens import estimate_tokens

    view = search_view_settings(settings)

    async def ask(query: str, chat_key: str) -> ToolAnswer:
        out = await run_session_search_tool(
            search,
            {"query": query},
            chat_key=chat_key,
            current_session_id=None,
            view=view,
            max_limit=settings.search.max_limit,
        )
        shown = out.view.message_ids if out.view is not None else frozenset()
        return ToolAnswer(shown, estimate_tokens(out.text))

    return ask


async def run_recall(
    paths: Sequence[Path],
    ks: Sequence[int],
    home: Path,
    names: Sequence[str] = (),
    shipped: str = "contextual",
    tool_settings: Settings | None = None,
) -> RecallRun:
    """``tool_settings``: also ask through the tool with these settings (``--as-tool``)."""
    from mnemo.memory.semantic import SemanticRetriever, embed_pending

    files = dataset_files(paths)
    datasets = [load_dataset(p) for p in files]
    db = state_database(home / "state.db")
    await db.open()
    try:
        store = SessionStore(db)
        order = ["baseline", "shipped"] + [n for n in dict.fromkeys(names) if n not in ("baseline",)]
        retrievers: dict[str, Retriever] = {}
        for label in order:
            retrievers[label] = make_retriever(shipped if label == "shipped" else label)
        # The benchmark's extra indexes exist before the first row and follow every insert.
        await db.write(create_baseline_index)
        if any(isinstance(r, FusionRetriever) for r in retrievers.values()):
            await db.write(create_legacy_index)
        searches = {label: SessionSearch(db, retriever=r) for label, r in retrievers.items()}
        askers = {
            label: tool_asker(search, tool_settings) if tool_settings is not None else None
            for label, search in searches.items()
        }
        outcomes: dict[str, dict[str, list[QuestionOutcome]]] = {label: {} for label in retrievers}
        for i, ds in enumerate(datasets):
            stretch = DatasetImport(store, ds, f"bench:{i}:{ds.name}")
            for label in retrievers:
                outcomes[label][ds.name] = []
            for sessions, questions in timeline(ds):
                await stretch.add(sessions)
                if not questions:
                    continue
                for r in retrievers.values():
                    if isinstance(r, SemanticRetriever):
                        await embed_pending(db, r.embedder)
                report = stretch.report()
                for label, search in searches.items():
                    outcomes[label][ds.name] += await ask_questions(
                        search, ds, report, max(ks), questions=questions, as_tool=askers[label]
                    )
        return RecallRun(tuple(ds.name for ds in datasets), outcomes)
    finally:
        await db.close()


def _row(label: str, n: int, scores: Sequence[dict[str, float]], ks: Sequence[int]) -> str:
    cells = ["".join(f"{s[f'recall@{k}']:7.3f}" for s in scores) for k in ks]
    return f"{label:<24} {n:>5}  " + "  ".join(cells)


def _block(
    run: RecallRun,
    ks: Sequence[int],
    title: str,
    cells: Callable[[dict[str, float]], str],
    width: int,
) -> list[str]:
    """One table: a row per file, per category and overall; ``cells`` formats one
    retriever's scores."""
    labels = list(run.outcomes)
    head = f"{'dataset / [category]':<24} {'qs':>5}  {title}"
    lines = [head, "-" * max(len(head), 32 + width * len(labels))]
    every = {lb: [o for name in run.files for o in run.outcomes[lb][name]] for lb in labels}
    rows: list[tuple[str, dict[str, list[QuestionOutcome]]]] = [
        (name, {lb: run.outcomes[lb][name] for lb in labels}) for name in run.files
    ]
    for cat in sorted({o.category or "-" for o in every[labels[0]]}):
        rows.append((f"[{cat}]", {lb: [o for o in every[lb] if (o.category or "-") == cat] for lb in labels}))
    rows.append(("ALL", every))
    for name, per in rows:
        scores = [summarize(per[lb], ks) for lb in labels]
        lines.append(f"{name[:24]:<24} {len(per[labels[0]]):>5}  " + "".join(cells(sc) for sc in scores))
    return lines


def render(run: RecallRun, ks: Sequence[int]) -> list[str]:
    labels = list(run.outcomes)
    lines = ["recall@k per file and category; columns in each @k block: " + ", ".join(labels)]
    width = 7 * len(labels)
    lines += _block(
        run,
        ks,
        "  ".join(f"{'@' + str(k):>{width}}" for k in ks),
        lambda sc: "".join(f"{sc[f'recall@{k}']:7.3f}" for k in ks) + "  ",
        width * len(ks),
    )
    every = {lb: [o for name in run.files for o in run.outcomes[lb][name]] for lb in labels}
    totals = {lb: summarize(every[lb], ks) for lb in labels}
    for lb in labels:
        lines.append(f"any_hit@k {lb:<14}" + "  ".join(f"@{k}: {totals[lb][f'any_hit@{k}']:.3f}" for k in ks))
    for lb in labels:
        lines.append(
            f"session_recall@k {lb:<7}"
            + "  ".join(f"@{k}: {totals[lb][f'session_recall@{k}']:.3f}" for k in ks)
        )
    sb, ss = totals["baseline"], totals["shipped"]
    for k in ks:
        if sb[f"recall@{k}"] > 0:
            lines.append(f"shipped / baseline recall@{k}: {ss[f'recall@{k}'] / sb[f'recall@{k}']:.2f}x")
    if "seen" in totals["shipped"]:
        lines.append("")
        lines.append(
            "as the tool shows it: seen (share of evidence in the output), tokens median / p95; "
            + ", ".join(labels)
        )
        lines += _block(
            run,
            ks,
            "".join(f"{lb[:8] + ' seen':>14} {'tok':>6} {'p95':>6}" for lb in labels),
            lambda sc: (
                f"{sc.get('seen', 0.0):14.3f} {sc.get('tokens_median', 0):6.0f} {sc.get('tokens_p95', 0):6.0f}"
            ),
            27,
        )
    return lines


def overall(run: RecallRun, ks: Sequence[int]) -> dict[str, dict[str, float]]:
    out = {}
    for name, per_file in run.outcomes.items():
        scores = summarize([o for f in run.files for o in per_file[f]], ks)
        out[name] = {k: round(v, 4) for k, v in scores.items()}
    return out


def _recall(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.memory.semantic import SemanticUnavailable

    ks = parse_ks(args.k)
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-") as tmp:
        try:
            shipped = shipped_name(settings)
            run = asyncio.run(
                run_recall(
                    args.dataset, ks, Path(tmp), args.retriever, shipped, settings if args.as_tool else None
                )
            )
        except InvalidDataset as e:
            raise CommandError(str(e), EXIT_USAGE) from e
        except SemanticUnavailable as e:
            raise CommandError(str(e), EXIT_USAGE) from e
    for line in render(run, ks):
        print(line)
    if args.json:
        print(json.dumps(overall(run, ks)))
    sys.stdout.flush()
    return EXIT_OK
