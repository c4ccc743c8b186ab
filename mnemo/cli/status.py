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

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED
from mnemo.gateway.config import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="which processes (replicas) serve this bot")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.gateway.storage import backend_for
    from mnemo.profile_lock import holder

    serving = asyncio.run(backend_for(settings).serving(lambda: holder(settings.home)))
    report = {
        "backend": serving.backend,
        "running": serving.running,
        "replicas": serving.replicas,
        "dead": serving.dead,
    }
    print(json.dumps(report, indent=2) if args.json else "\n".join(serving.lines))
    return EXIT_OK if serving.running else EXIT_REFUSED
