"""``state.db`` as a whole: the one ordered migration list, and how a process opens it.

Each sub-system owns its tables and keeps their migrations beside its code; this is
the one place that knows their order (``memory/`` must not import the gateway, so it
cannot assemble the list itself). ``user_version`` counts the steps applied, so the
order below is part of every existing database: append, never insert, reorder or
rename (``tests/memory/test_db_migrations.py`` pins the historical names)::

    0001_sessions_and_messages   memory/migrations.py
    0002_inbox                   gateway/delivery/schema.py
    0003_cjk_view                memory/migrations.py
    0004_outbox                  gateway/delivery/schema.py
    0005_pairings                gateway/inbound/schema.py
    0006_jobs                    gateway/jobs/schema.py
    0007_cron_jobs               gateway/cron/schema.py

Every process that opens ``state.db`` (the gateway, each CLI command, a benchmark)
goes through ``state_database``.

``Transaction`` is the handle a backend's ``write`` gives the function it runs: for
SQLite the writer connection inside ``BEGIN IMMEDIATE``. A repository that must change
its rows in another repository's transaction (cron finishing a run together with its
outbox delivery) receives it from that repository's ``write`` and passes it to a
``…_within(tx, …)`` method; a PostgreSQL backend hands its own connection the same way.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, TypeAlias

from mnemo.gateway.cron.schema import CRON_JOBS
from mnemo.gateway.delivery.schema import INBOX, OUTBOX
from mnemo.gateway.inbound.schema import PAIRINGS
from mnemo.gateway.jobs.schema import JOBS
from mnemo.memory.db import Database
from mnemo.memory.migrations import CJK_VIEW, SESSIONS_AND_MESSAGES, Migration

Transaction: TypeAlias = sqlite3.Connection

STATE_MIGRATIONS: tuple[Migration, ...] = (
    SESSIONS_AND_MESSAGES,
    INBOX,
    CJK_VIEW,
    OUTBOX,
    PAIRINGS,
    JOBS,
    CRON_JOBS,
)


def state_database(path: Path | str, **options: Any) -> Database:
    """A (not yet opened) ``Database`` for ``state.db`` with the whole migration list;
    ``options`` are ``Database``'s tuning keywords (readers, busy timeout, …)."""
    return Database(path, migrations=STATE_MIGRATIONS, **options)
