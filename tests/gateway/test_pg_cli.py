"""``mnemo sessions list|show|search|import`` and ``mnemo cron add|list|pause|remove`` open
the configured backend: with ``database.url`` they read and write PostgreSQL (what every
replica sees), never a ``state.db``. Each command runs as a real process."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from tests.gateway.test_cli_errors import mnemo
from tests.gateway.test_cli_sessions import CHAT
from tests.support.pgcluster import Cluster


def test_sessions_commands_work_on_postgresql(pg_cluster: Cluster, home: Path, tmp_path: Path) -> None:
    url = pg_cluster.fresh_database()
    env = {"MNEMO_DATABASE_URL": url}
    chat = tmp_path / "ann.json"
    chat.write_text(json.dumps(CHAT))
    out = mnemo(home, "sessions", "import", str(chat), "--chat", "telegram:dm:7", **env)
    assert out.returncode == 0, out.stderr
    assert "imported 2 sessions, 3 messages into chat telegram:dm:7" in out.stdout
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone() == (3,)

    listed = mnemo(home, "sessions", "list", "--chat", "telegram:dm:7", **env)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].split()[1] == "2024-03-09"
    first_id = lines[1].split()[0]
    as_json = mnemo(home, "sessions", "list", "--json", **env)
    assert [json.loads(line)["id"] for line in as_json.stdout.splitlines()][1] == first_id

    shown = mnemo(home, "sessions", "show", first_id, **env)
    assert shown.returncode == 0, shown.stderr
    assert (
        "Ann: We adopted a beagle called Biscuit" in shown.stdout
        and "assistant: Congratulations" in shown.stdout
    )
    missing = mnemo(home, "sessions", "show", "no-such-session", **env)
    assert missing.returncode == 1 and "no session 'no-such-session'" in missing.stderr

    found = mnemo(home, "sessions", "search", "biscuit", "--chat", "telegram:dm:7", **env)
    assert found.returncode == 0, found.stderr
    assert "Biscuit chewed my slippers" in found.stdout and "We adopted a beagle" in found.stdout
    every_chat = mnemo(home, "sessions", "search", "slippers", "--json", **env)  # no --chat: all chats
    assert every_chat.returncode == 0, every_chat.stderr
    result = json.loads(every_chat.stdout)
    assert result["count"] >= 1 and "slippers" in json.dumps(result["results"])
    assert not (home / "state.db").exists(), "nothing was read from or written to SQLite"

    # Without database.url the same commands use state.db, which holds none of it.
    local = mnemo(home, "sessions", "list")
    assert local.returncode == 0 and local.stdout == "" and "no sessions" in local.stderr


def test_cron_commands_work_on_postgresql(pg_cluster: Cluster, home: Path) -> None:
    url = pg_cluster.fresh_database()
    env = {"MNEMO_DATABASE_URL": url}
    added = mnemo(home, "cron", "add", "--chat", "telegram:42", "--every", "1d", "water the plants", **env)
    assert added.returncode == 0, added.stderr
    job_id = added.stdout.split()[0]
    listed = mnemo(home, "cron", "list", "--json", **env)
    assert listed.returncode == 0, listed.stderr
    (job,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert job["id"] == job_id and "water the plants" in json.dumps(job)
    paused = mnemo(home, "cron", "pause", job_id, **env)
    assert paused.returncode == 0 and f"paused {job_id}" in paused.stdout, paused.stderr
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT id, state FROM cron_jobs").fetchall() == [(job_id, "paused")]
    removed = mnemo(home, "cron", "remove", job_id, **env)
    assert removed.returncode == 0, removed.stderr
    empty = mnemo(home, "cron", "list", **env)
    assert empty.returncode == 0 and "no scheduled jobs" in empty.stderr
    assert not (home / "state.db").exists(), "nothing was read from or written to SQLite"


def test_an_unreachable_server_is_one_clear_line_for_sessions_and_cron(
    pg_cluster: Cluster, home: Path
) -> None:
    env = {"MNEMO_DATABASE_URL": pg_cluster.url("no_such_database")}
    for argv in (("sessions", "list"), ("cron", "list")):
        out = mnemo(home, *argv, **env)
        assert out.returncode == 2, (argv, out.stderr)
        lines = [line for line in out.stderr.splitlines() if line.startswith("mnemo: ")]
        assert len(lines) == 1 and "no_such_database" in lines[0] and "Traceback" not in out.stderr, (
            out.stderr
        )
