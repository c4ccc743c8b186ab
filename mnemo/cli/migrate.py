"""``mnemo migrate --to postgresql://…``: copy this SQLite profile into PostgreSQL
(``mnemo/migrate.py``). The profile is only read; a second run copies nothing new, and a
run that was killed resumes where it stopped.

Exit codes: 0 copied and verified (or finished by an earlier run), 1 refused (the
profile is in use, the target already holds other data, a count does not match), 2 usage
(not a PostgreSQL URL, the server is unreachable, the ``postgres`` extra is missing, no
SQLite profile here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.extras import install_hint


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "migrate",
        help="copy this SQLite profile (state.db, memories) into a PostgreSQL database",
        description="Copy everything this profile keeps in state.db, and its curated memory, into an empty "
        "PostgreSQL database (then point database.url / MNEMO_DATABASE_URL at it). The profile is only read. "
        "Resumable: run it again after an interruption; a finished migration is only verified.",
    )
    p.add_argument("--to", required=True, metavar="URL", help="postgresql://user:password@host:5432/dbname")
    p.add_argument("--json", action="store_true", help="print the receipt as JSON")
    p.add_argument(
        "--batch-size", type=int, default=2000, metavar="N", help="rows per transaction (default 2000)"
    )
    p.set_defaults(handler=_migrate)


def _url(text: str) -> str:
    url = text.strip()
    if url.split("://", 1)[0].lower() not in ("postgresql", "postgres") or "://" not in url:
        raise CommandError("--to must be a postgresql://… URL", EXIT_USAGE)
    return url


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    url = _url(args.to)
    if args.batch_size < 1:
        raise CommandError("--batch-size must be at least 1", EXIT_USAGE)
    if not settings.state_db.is_file():
        raise CommandError(f"no SQLite profile to migrate: {settings.state_db} does not exist", EXIT_USAGE)
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as e:
        raise CommandError(
            f"mnemo migrate needs {e.name or 'psycopg'}: {install_hint('postgres')}", EXIT_USAGE
        ) from None
    from mnemo.cli.terminal import ProgressBar
    from mnemo.memory.errors import SchemaTooNew, StoreError
    from mnemo.migrate import MigrateRefused, Migration, NotMigrated
    from mnemo.profile_lock import hold

    bar = ProgressBar()
    migration = Migration(settings.state_db, url, batch_size=args.batch_size, progress=bar.update)
    with hold(settings.home):  # never beside a bot running on this profile
        try:
            receipt = asyncio.run(migration.run())
            memories = asyncio.run(_memories(settings, url, receipt))
        except MigrateRefused as e:
            raise CommandError(str(e), EXIT_REFUSED) from None
        except (SchemaTooNew, StoreError) as e:  # bad URL, unreachable, a newer schema there
            raise CommandError(str(e).splitlines()[0], EXIT_USAGE) from None
        finally:
            bar.close()
    from mnemo.migrate import provider_data

    facts = None
    for name in provider_data(settings.providers_dir):
        if name == "holographic":
            facts, why = _facts(settings, url)
            if facts is not None:
                continue
        else:
            why = "no PostgreSQL home for it yet: it stays in this profile's folder"
        receipt.not_migrated.append(NotMigrated(f"provider data providers/{name}", why))
    if args.json:
        from mnemo.adapters.terminal import printable_json

        out = receipt.to_json()
        out["memories"] = None if memories is None else memories.to_json()
        out["facts"] = None if facts is None else facts.to_json()
        print(printable_json(json.dumps(out, ensure_ascii=False, indent=2)))
    else:
        from mnemo.adapters.terminal import printable

        for line in report(receipt, memories):
            print(printable(line))
        if facts is not None:
            state = "verified" if facts.verified else "NOT verified: some are missing"
            print(
                f"holographic facts: {facts.source} in facts.db: {facts.copied} copied, "
                f"{facts.present} already there, {state}"
            )
    # Once finished, counts may differ for good reasons (the bot has run on PostgreSQL
    # since): the receipt says so, and a finished move is not a failed one.
    return EXIT_OK if receipt.verified or receipt.already_complete else EXIT_REFUSED


def _facts(settings: Settings, url: str) -> tuple[Any, str]:
    """The holographic facts (``providers/holographic/facts.db``) into PostgreSQL; (the
    copy, "") or (None, why not)."""
    from mnemo.memory.errors import MemoryRefused, StoreError
    from mnemo.providers.holographic.pg_store import copy_facts

    path = settings.providers_dir / "holographic" / "facts.db"
    if not path.is_file():
        return None, "no facts.db in it: it stays in this profile's folder"
    from mnemo.profile_lock import hold

    try:
        with hold(settings.home):  # never beside a bot writing facts.db
            return copy_facts(path, url), ""
    except (StoreError, MemoryRefused) as e:
        return None, f"facts.db not copied: {str(e).splitlines()[0]}"


async def _memories(settings: Settings, url: str, receipt: Any) -> Any:
    from mnemo.migrate import NotMigrated, copy_memories, curated_files, curated_repository_available

    files = curated_files(settings.memories_dir)
    if not files:
        return None
    if not curated_repository_available():
        receipt.not_migrated.append(
            NotMigrated(
                f"curated memory ({len(files)} files)",
                "no PostgreSQL home for it in this mnemo: the files stay in memories/",
            )
        )
        return None
    return await asyncio.to_thread(
        copy_memories,
        settings.memories_dir,
        url,
        settings.memory.memory_char_limit,
        settings.memory.user_char_limit,
    )


def report(receipt: Any, memories: Any) -> list[str]:
    state = "verified" if receipt.verified else "NOT verified: counts differ"
    head = f"{receipt.source} -> {receipt.target}: {receipt.copied:,} rows copied, {state}"
    if receipt.already_complete:
        head += " (an earlier run had finished; nothing to copy)"
    out = [head]
    if receipt.already_complete and not receipt.verified:
        out.append(
            "  the counts changed since that run: the bot has run on PostgreSQL (and, say, pruned old jobs), "
            "or state.db was written after the move; rows added to state.db since are not copied"
        )
    width = max((len(t.name) for t in receipt.tables), default=0)
    for t in receipt.tables:
        mark = "ok" if t.verified else "MISMATCH"
        line = (
            f"  {t.name:<{width}}  {t.source_rows:>9,} in state.db  {t.present:>9,} in PostgreSQL  "
            f"{t.copied:>9,} copied now  {mark}"
        )
        if t.left_out_columns:
            line += f"  (columns left out: {', '.join(t.left_out_columns)})"
        out.append(line)
    if memories is not None:
        out.append(
            f"curated memory: {memories.files} files, {memories.entries} entries: {memories.copied} copied, "
            f"{memories.present} already there, {len(memories.refused)} refused"
        )
        out.extend(f"  refused in {name}: {why}" for name, why in memories.refused)
    for n in receipt.not_migrated:
        out.append(f"not migrated: {n.what} — {n.why}")
    if receipt.verified:
        out.append("next: set database.url (or MNEMO_DATABASE_URL) to this database and start mnemo")
    return out
