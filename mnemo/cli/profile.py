"""``mnemo export FILE`` / ``mnemo import FILE``: a whole profile in one archive, to move
it between machines or between backends (``mnemo/archives``: the format, what it holds
and what it leaves out). ``mnemo import --from hermes|openclaw PATH`` moves in from
another agent instead: it adds to this profile, see ``mnemo/importers/``.

Export reads the configured backend (a consistent snapshot while the bot runs) and
prints exactly which secrets it left out. Import restores into the configured backend,
refusing a profile that holds data unless ``--force`` (what it replaces is kept in
``.replaced-<time>/``) and a profile a bot serves.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.gateway.errors import ArchiveRefused

if TYPE_CHECKING:
    from mnemo.archives.export import Exported
    from mnemo.archives.restore import Restored


def register(subparsers: Any) -> None:
    exp = subparsers.add_parser(
        "export",
        help="write the whole profile to a .tar.gz; secrets are left out (it prints which)",
        description="Write the whole profile — conversations, memory, facts, skills, media, persona, settings — "
        "to FILE, read from the configured backend (SQLite or PostgreSQL) while the bot may run. Secrets are left "
        "out: .env, admin_token, provider secrets, and every secret setting in config.yaml (replaced by a marker); "
        "the command lists each one. `mnemo import FILE` restores it on either backend.",
    )
    exp.add_argument("file", metavar="FILE")
    exp.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    exp.set_defaults(handler=_export)
    imp = subparsers.add_parser(
        "import",
        help="restore a profile exported with `mnemo export`, or move in from Hermes Agent or OpenClaw",
        description="Without --from: restore FILE, an archive written by `mnemo export` or a backup, into the "
        "configured backend (refused when the profile holds data, unless --force). With --from: read a Hermes "
        "Agent profile (~/.hermes, or its backup .zip/.tar.gz) or an OpenClaw folder (~/.openclaw, or a workspace) "
        "and add its memory, persona, skills and conversations to this profile (see docs/backups.md).",
    )
    imp.add_argument("file", metavar="FILE")
    imp.add_argument(
        "--force",
        action="store_true",
        help="restore over a profile that holds data (what it replaces is kept aside)",
    )
    imp.add_argument(
        "--from",
        dest="source_kind",
        choices=("hermes", "openclaw"),
        help="FILE is a Hermes Agent profile or an OpenClaw folder, not a mnemo export",
    )
    imp.add_argument(
        "--user",
        metavar="PLATFORM:ID",
        help="with --from: whose USER.md the source's profile becomes (required for hermes)",
    )
    imp.add_argument(
        "--chat-map",
        metavar="SOURCE=TARGET",
        action="append",
        help="with --from: put the conversations of SOURCE (as the dry run lists it) in mnemo chat TARGET "
        "(PLATFORM:CHAT_ID or a session key); repeatable",
    )
    imp.add_argument(
        "--chat-map-file",
        metavar="FILE",
        action="append",
        help="with --from: SOURCE=TARGET lines (# comments) read from FILE",
    )
    imp.add_argument(
        "--dry-run", action="store_true", help="with --from: print what would be imported, write nothing"
    )
    imp.add_argument("--json", action="store_true", help="with --from: print the receipt as JSON")
    imp.set_defaults(handler=_import)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def export_lines(exported: Exported, verb: str = "exported") -> list[str]:
    """What ``mnemo export`` and ``mnemo backup now`` print: what was written, from
    where, and exactly what was left out."""
    source = exported.source
    lines = [
        f"{verb} {_plural(exported.total_rows, 'row')}, {_plural(exported.curated, 'curated memory file')} "
        f"and {_plural(exported.files, 'member')} in all, from {source.backend} ({source.schema}), to {exported.path}"
    ]
    if exported.left_out:
        lines.append("left out (secrets never leave this machine):")
        lines.extend(f"  {item}" for item in exported.left_out)
    else:
        lines.append("left out: no secrets were found in this profile")
    return lines


def _export(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.archives.export import export_profile
    from mnemo.gateway.storage import backend_for

    try:
        exported = export_profile(
            settings, backend_for(settings).archive(), Path(args.file).expanduser(), force=args.force
        )
    except ArchiveRefused as e:
        raise CommandError(f"export refused: {e}", EXIT_REFUSED) from None
    for line in export_lines(exported):
        print(line)
    return EXIT_OK


def restore_lines(restored: Restored, home: Path) -> list[str]:
    loaded = restored.loaded
    lines = [
        f"restored {sum(loaded.rows.values()):,} rows, {loaded.curated} curated memory files and "
        f"{restored.files} files (taken from {restored.source.backend}) into {home}"
    ]
    if restored.replaced is not None:
        lines.append(f"what it replaced was moved to {restored.replaced}")
    if restored.left_out:
        lines.append(
            "the archive left these out — set them again (.env, config.yaml, `mnemo providers setup`):"
        )
        lines.extend(f"  {item}" for item in restored.left_out)
    else:
        lines.append(
            "secrets are never part of an archive: recreate .env (and provider secrets with `mnemo providers setup`)"
        )
    return lines


def _import(args: argparse.Namespace, settings: Settings) -> int:
    if args.source_kind is not None:
        from mnemo.importers.command import import_foreign

        return import_foreign(args, settings)
    extra = [
        flag
        for flag, on in (
            ("--user", args.user),
            ("--chat-map", args.chat_map),
            ("--chat-map-file", args.chat_map_file),
            ("--dry-run", args.dry_run),
            ("--json", args.json),
        )
        if on
    ]
    if extra:
        raise CommandError(f"{', '.join(extra)}: only with --from hermes|openclaw", EXIT_USAGE)
    from mnemo.backups import restore

    path = Path(args.file).expanduser()
    if not path.is_file():
        raise CommandError(f"{path}: no such file", EXIT_USAGE)
    try:
        restored = restore(settings, path, force=args.force)
    except ArchiveRefused as e:
        raise CommandError(f"refused: {e}", EXIT_REFUSED) from None
    for line in restore_lines(restored, settings.home):
        print(line)
    return EXIT_OK
