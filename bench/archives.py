"""Backups on both backends: size and time of ``mnemo backup now`` (snapshot, write,
verify) and of a restore into a fresh profile, for a small profile and one of 10,000
messages. Prints figures; asserts nothing.

    python bench/archives.py [--messages 20 10000] [--backend sqlite|postgresql|both]

Each profile gets 50 sessions (the messages spread over them, alternating user and
assistant, ~200 characters each), a MEMORY.md, one USER.md per session's person, and
a holographic fact per session. PostgreSQL runs use a throw-away cluster
(``tests/support/pgcluster.py``), a fresh database per profile. A restore goes into a
fresh profile of the same backend.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnemo.archives.restore import verify_archive
from mnemo.backups import backup_now, restore
from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.storage import open_backend
from mnemo.memory.scope import UserRef
from mnemo.memory.sessions import NewMessage

SESSIONS = 50
TEXT = "The quick brown fox jumps over the lazy dog while the bot keeps notes about it. " * 2


def home_on(root: Path, name: str, url: str | None) -> Settings:
    home = root / name
    home.mkdir()
    if url is not None:
        (home / "config.yaml").write_text(f"database:\n  url: {url}\n")
    return load_settings(home, environ={})


async def seed(settings: Settings, messages: int) -> None:
    storage = await open_backend(settings)
    try:
        files = storage.files
        await asyncio.to_thread(
            files.shared().add, "Deploys run on Fridays; the staging cluster is rebuilt nightly."
        )
        per = max(1, messages // SESSIONS)
        left = messages
        for i in range(SESSIONS):
            if left <= 0:
                break
            user = UserRef("telegram", str(1000 + i))
            await asyncio.to_thread(files.user(user).add, f"Person {i} prefers short answers.")
            session = await storage.sessions.create_session(
                chat_key=f"telegram:dm:{1000 + i}",
                platform="telegram",
                chat_id=str(1000 + i),
                thread_id=None,
                user_id=str(1000 + i),
                agent_context="primary",
                source="chat",
                model="bench",
                system_prompt="You are a helpful bot. " * 40,
            )
            n = min(per, left)
            batch = [NewMessage("user" if j % 2 == 0 else "assistant", f"{j} {TEXT}") for j in range(n)]
            for k in range(0, len(batch), 500):
                await storage.sessions.append_messages(session.id, batch[k : k + 500])
            left -= n
    finally:
        await storage.close()


def seed_facts(settings: Settings) -> None:
    """A few holographic facts, through the CLI (which runs its own event loop)."""
    from mnemo.cli.main import main

    for i in range(min(SESSIONS, 10)):
        main(
            [
                "--home",
                str(settings.home),
                "facts",
                "add",
                f"Person {i} lives in city {i}.",
                "--user",
                f"telegram:{1000 + i}",
            ]
        )


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run(backend: str, messages: int, cluster: Any) -> None:
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-archives-") as tmp:
        root = Path(tmp)
        url = cluster.fresh_database() if cluster is not None else None
        settings = home_on(root, "source", url)
        asyncio.run(seed(settings, messages))
        seed_facts(settings)
        # Twice: the first pays for imports (providers, numpy) once per process.
        timed(lambda: backup_now(settings, datetime(2026, 1, 1, tzinfo=UTC)))
        exported, took = timed(lambda: backup_now(settings, datetime(2026, 1, 2, tzinfo=UTC)))
        verified, verify_s = timed(lambda: verify_archive(exported.path))
        target = home_on(root, "target", cluster.fresh_database() if cluster is not None else None)
        restored, restore_s = timed(lambda: restore(target, exported.path))
        size = exported.path.stat().st_size
        print(
            f"{backend:<10} {messages:>6} messages  {exported.total_rows:>6} rows  archive {size / 1024:>8,.1f} KiB  "
            f"backup now {took:6.2f} s (of it verify {verify_s:5.2f} s)  restore {restore_s:6.2f} s  "
            f"rows restored {sum(restored.loaded.rows.values()):>6}  verified rows {verified.rows}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[20, 10_000])
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    args = parser.parse_args()
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    cluster_cm: AbstractContextManager[Any] = nullcontext()
    if "postgresql" in backends:
        from tests.support.pgcluster import running_cluster

        cluster_cm = running_cluster()
    with cluster_cm as cluster:
        for backend in backends:
            for n in args.messages:
                run(backend, n, cluster if backend == "postgresql" else None)


if __name__ == "__main__":
    main()
