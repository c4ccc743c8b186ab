"""``mnemo status [--json]``: which processes serve this bot.

On PostgreSQL (``database.url``) every ``mnemo run`` replica writes a heartbeat
(``gateway/replicas.py``): listed are the live ones (alive, last beat within
``STALE_AFTER_S``) with their adapters and leader roles, then those that stopped or died
recently. On SQLite one process serves a profile: the holder of the profile lock
(``mnemo.profile_lock``), or "not running".

Exit 0 when at least one process serves, 1 when none does (for scripts and health checks).

``--json`` prints one object: ``backend`` ("sqlite" | "postgresql"), ``running`` (bool),
``replicas`` (live ones) and ``dead`` (recently stopped or dead ones), each replica with
``replica_id``, ``host``, ``pid``, ``version``, ``started_at``, ``last_seen``,
``stopped_at``, ``adapters``, ``roles``, ``alive`` and ``last_seen_s_ago``. On SQLite
``replicas`` holds at most the one process, with ``pid`` only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from datetime import UTC, datetime
from typing import Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED
from mnemo.gateway.config import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="which processes (replicas) serve this bot")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _sqlite(settings: Settings) -> dict[str, Any]:
    from mnemo.profile_lock import holder

    pid = holder(settings.home)
    replicas = [] if pid is None else [{"replica_id": f"{socket.gethostname()}:{pid}", "pid": pid}]
    return {"backend": "sqlite", "running": pid is not None, "replicas": replicas, "dead": []}


async def _postgresql(settings: Settings) -> dict[str, Any]:
    from mnemo.gateway.storage import open_backend
    from mnemo.gateway.storage_pg.heartbeats import is_live, list_replicas

    backend = await open_backend(settings)
    try:
        rows = await list_replicas(backend.db)
    finally:
        await backend.close()
    live = [r.as_json() for r in rows if is_live(r)]
    dead = [r.as_json() for r in rows if not is_live(r)]
    return {"backend": "postgresql", "running": bool(live), "replicas": live, "dead": dead}


def _print(report: dict[str, Any]) -> None:
    if report["backend"] == "sqlite":
        if report["replicas"]:
            print(f"running: PID {report['replicas'][0]['pid']} (SQLite: one process per profile)")
        else:
            print("not running")
        return
    live, dead = report["replicas"], report["dead"]
    print(f"{len(live)} live replica{'s' if len(live) != 1 else ''} on PostgreSQL")
    for r in live:
        adapters = (
            ", ".join(f"{n}{'' if ok else ' (down)'}" for n, ok in sorted(r["adapters"].items())) or "-"
        )
        roles = ", ".join(r["roles"]) or "-"
        print(
            f"  {r['replica_id']}  v{r['version']}  since {_when(r['started_at'])}  "
            f"beat {r['last_seen_s_ago']:g} s ago  adapters: {adapters}  roles: {roles}"
        )
    if dead:
        print("recently stopped or dead:")
        for r in dead:
            how = (
                f"stopped {_when(r['stopped_at'])}"
                if r["stopped_at"] is not None
                else f"last beat {_when(r['last_seen'])}"
            )
            print(f"  {r['replica_id']}  v{r['version']}  {how}")


def run(args: argparse.Namespace, settings: Settings) -> int:
    report = asyncio.run(_postgresql(settings)) if settings.database.is_postgresql else _sqlite(settings)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return EXIT_OK if report["running"] else EXIT_REFUSED
