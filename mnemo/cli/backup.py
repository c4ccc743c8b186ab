"""``mnemo backup now|list|verify [FILE]|restore FILE``: the automatic backups by hand
(``mnemo/backups.py``; the archive is the one ``mnemo export`` writes, on either backend).
``verify`` without a file checks the newest backup; ``list`` and ``verify`` take ``--json``."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.gateway.errors import ArchiveRefused


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("backup", help="take, list, verify or restore backups of this profile")
    sub = p.add_subparsers(dest="backup_command", metavar="ACTION", required=True)
    sub.add_parser(
        "now",
        help="write a backup of the configured backend now (verified, older ones pruned beyond backup.keep; "
        "secrets left out)",
    ).set_defaults(handler=_now)
    ls = sub.add_parser(
        "list", help="the backups in backup.dir, oldest first, with the backend each was taken from"
    )
    ls.add_argument("--json", action="store_true", help="print a JSON list of {path, created, size, backend}")
    ls.set_defaults(handler=_list)
    v = sub.add_parser(
        "verify",
        help="check an archive (default: the newest backup): every checksum, every table's row count, every row",
    )
    v.add_argument("file", metavar="FILE", nargs="?", help="the archive (default: the newest in backup.dir)")
    v.add_argument("--json", action="store_true", help="print one JSON object {path, ok, files, error}")
    v.set_defaults(handler=_verify)
    r = sub.add_parser(
        "restore",
        help="restore an archive into this profile's backend while no bot runs; refused when the profile "
        "holds data, unless --force (what it replaces is kept aside)",
    )
    r.add_argument("file", metavar="FILE")
    r.add_argument("--force", action="store_true", help="restore over a profile that holds data")
    r.set_defaults(handler=_restore)


def _now(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.backups import backup_now
    from mnemo.cli.profile import export_lines

    try:
        exported = backup_now(settings, datetime.now(UTC))
    except ArchiveRefused as e:
        raise CommandError(f"backup failed: {e}", EXIT_REFUSED) from None
    for line in export_lines(exported, verb="backup written and verified:"):
        print(line)
    return EXIT_OK


def _list(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.archives.restore import source_of
    from mnemo.backups import backup_dir, list_backups

    folder = backup_dir(settings)
    backups = list_backups(folder)
    if args.json:
        rows = [
            {
                "path": str(b.path),
                "created": b.created.isoformat(),
                "size": b.size,
                "backend": source_of(b.path),
            }
            for b in backups
        ]
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not backups:
        print(f"no backups in {folder}")
    for b in backups:
        print(f"{b.created:%Y-%m-%d %H:%M:%S} UTC  {b.size:>12,} bytes  {source_of(b.path):<10}  {b.path}")
    return EXIT_OK


def _archive(args: argparse.Namespace) -> Path:
    path = Path(args.file).expanduser()
    if not path.is_file():
        raise CommandError(f"{path}: no such file", EXIT_USAGE)
    return path


def _newest(settings: Settings) -> Path:
    from mnemo.backups import backup_dir, list_backups

    folder = backup_dir(settings)
    backups = list_backups(folder)
    if not backups:
        raise CommandError(
            f"no backups in {folder}: take one with `mnemo backup now`, or name a FILE", EXIT_USAGE
        )
    return max(backups, key=lambda b: b.created).path


def _verify(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.archives.restore import verify_archive

    path = _archive(args) if args.file is not None else _newest(settings)
    try:
        verified = verify_archive(path)
    except ArchiveRefused as e:
        if args.json:
            print(json.dumps({"path": str(path), "ok": False, "files": None, "error": str(e)}, indent=2))
            return EXIT_REFUSED
        raise CommandError(f"{path}: verification failed: {e}", EXIT_REFUSED) from None
    if args.json:
        out = {"path": str(path), "ok": True, "files": verified.files, "error": None}
        print(json.dumps({**out, "backend": verified.source.backend, "version": verified.version}, indent=2))
        return EXIT_OK
    what = "databases intact" if verified.version == 1 else f"{verified.rows:,} rows match their counts"
    print(
        f"{path}: OK ({verified.files} files, checksums match, {what}; "
        f"taken from {verified.source.backend}, format version {verified.version})"
    )
    return EXIT_OK


def _restore(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.backups import restore
    from mnemo.cli.profile import restore_lines

    path = _archive(args)
    try:
        restored = restore(settings, path, force=args.force)
    except ArchiveRefused as e:
        raise CommandError(f"restore refused: {e}", EXIT_REFUSED) from None
    for line in restore_lines(restored, settings.home):
        print(line)
    return EXIT_OK
