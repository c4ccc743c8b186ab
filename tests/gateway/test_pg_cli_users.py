"""``mnemo users list|show|usage|budget|link|unlink|erase`` and ``mnemo doctor`` on
PostgreSQL: with ``database.url`` they read and write the server every replica shares,
never a ``state.db``. Each command runs as a real process."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from tests.gateway.test_cli_errors import mnemo
from tests.gateway.test_cli_sessions import CHAT
from tests.support.pgcluster import Cluster


def _seed(url: str, home: Path, tmp_path: Path) -> dict[str, str]:
    """telegram:7 has two sessions (imported), telegram:7 and telegram:8 spend this month,
    telegram:9 has a USER.md row."""
    env = {"MNEMO_DATABASE_URL": url}
    chat = tmp_path / "ann.json"
    chat.write_text(json.dumps(CHAT))
    imported = mnemo(home, "sessions", "import", str(chat), "--chat", "telegram:dm:7", **env)
    assert imported.returncode == 0, imported.stderr
    added = mnemo(
        home, "memory", "add", "--target", "user", "--user", "telegram:9", "Prefers green tea", **env
    )
    assert added.returncode == 0, added.stderr
    today = datetime.now(UTC).date().isoformat()
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE sessions SET user_id = '7'")  # an import names no speaker; a DM's user is 7
        for payer, usd, tokens in (("telegram:7", 0.25, 1000), ("telegram:8", 1.5, 9000), ("*", 1.75, 10000)):
            conn.execute(
                "INSERT INTO usage_days (payer, day, cost_usd, tokens, requests) VALUES (%s, %s, %s, %s, 1)",
                (payer, today, usd, tokens),
            )
    return env


def test_users_list_show_usage_and_budget_on_postgresql(
    pg_cluster: Cluster, home: Path, tmp_path: Path
) -> None:
    url = pg_cluster.fresh_database()
    env = _seed(url, home, tmp_path)

    listed = mnemo(home, "users", "list", "--json", **env)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == ["telegram:7", "telegram:8", "telegram:9"]

    usage = mnemo(home, "users", "usage", "--json", **env)
    assert usage.returncode == 0, usage.stderr
    rows = json.loads(usage.stdout)
    assert [(r["user"], r["month_usd"], r["day_tokens"]) for r in rows] == [
        ("telegram:8", 1.5, 9000),
        ("telegram:7", 0.25, 1000),
    ]

    shown = mnemo(home, "users", "show", "telegram:7", **env)
    assert shown.returncode == 0, shown.stderr
    assert "sessions: 2, messages written: 0, profile: no" in shown.stdout
    assert "spend: today $0.2500 (1,000 tokens), month $0.2500" in shown.stdout
    profile = mnemo(home, "users", "show", "telegram:9", "--json", **env)
    assert profile.returncode == 0, profile.stderr
    assert json.loads(profile.stdout)["sessions"] == 0
    assert "profile: yes" in mnemo(home, "users", "show", "telegram:9", **env).stdout
    nobody = mnemo(home, "users", "show", "telegram:404", **env)
    assert nobody.returncode == 1 and "mnemo knows nothing of this person" in nobody.stdout

    capped = mnemo(home, "users", "budget", "telegram:8", "--daily-usd", "2", "--json", **env)
    assert capped.returncode == 0, capped.stderr
    data = json.loads(capped.stdout)
    assert data["limits"]["daily_usd"] == 2 and data["own_limits"]["daily_usd"] == 2
    assert data["spend"]["month_usd"] == 1.5
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT payer, daily_usd FROM budget_overrides").fetchall() == [
            ("telegram:8", 2.0)
        ]
    more = mnemo(home, "users", "budget", "telegram:8", "--daily-tokens", "500", "--json", **env)
    assert json.loads(more.stdout)["own_limits"] == {
        "daily_usd": 2.0,
        "monthly_usd": None,
        "daily_tokens": 500,
    }
    cleared = mnemo(home, "users", "budget", "telegram:8", "--clear", **env)
    assert cleared.returncode == 0 and "(default)" in cleared.stdout, cleared.stderr
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM budget_overrides").fetchone() == (0,)
    assert not (home / "state.db").exists(), "nothing was read from or written to SQLite"

    # Without database.url the same commands use state.db, which knows nobody.
    local = mnemo(home, "users", "list")
    assert local.returncode == 0 and local.stdout.strip() == "nobody yet"


def test_users_link_unlink_and_erase_on_postgresql(pg_cluster: Cluster, home: Path, tmp_path: Path) -> None:
    url = pg_cluster.fresh_database()
    env = _seed(url, home, tmp_path)
    linked = mnemo(home, "users", "link", "telegram:9", "telegram:7", "--json", **env)
    assert linked.returncode == 0, linked.stderr
    data = json.loads(linked.stdout)
    assert data["linked"] and data["canonical"] == "telegram:9"
    assert sorted(data["members"]) == ["telegram:7", "telegram:9"]
    shown = json.loads(mnemo(home, "users", "show", "telegram:7", "--json", **env).stdout)
    assert {r["user"]: r["canonical"] for r in shown["linked"]} == {"telegram:9": True, "telegram:7": False}
    text = mnemo(home, "users", "show", "telegram:7", **env).stdout
    assert "profile: yes" in text, "linked accounts share the canonical account's USER.md row"
    usage = json.loads(mnemo(home, "users", "usage", "--json", **env).stdout)
    assert ("telegram:9", 0.25) in [(r["user"], r["month_usd"]) for r in usage], (
        "one payer for linked accounts"
    )
    again = mnemo(home, "users", "link", "telegram:7", "telegram:9", **env)
    assert again.returncode == 0 and "already linked" in again.stdout

    unlinked = mnemo(home, "users", "unlink", "telegram:7", "--json", **env)
    assert unlinked.returncode == 0, unlinked.stderr
    assert json.loads(unlinked.stdout) == {
        "user": "telegram:7",
        "unlinked": True,
        "remaining": ["telegram:9"],
    }
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM identity_links").fetchone() == (0,)
        copied = conn.execute("SELECT content FROM curated_memory WHERE owner = 'telegram:7'").fetchone()
        assert copied is not None and "Prefers green tea" in copied[0], "the split-off account keeps a copy"
    not_linked = mnemo(home, "users", "unlink", "telegram:7", **env)
    assert not_linked.returncode == 1 and "is not linked" in not_linked.stdout

    erase = mnemo(home, "users", "erase", "telegram:7", "--yes", "--json", **env)
    assert erase.returncode == 0, erase.stderr
    receipt = json.loads(erase.stdout)
    assert receipt["removed"]["sessions"] == 2 and receipt["removed"]["profile"] == 1
    assert receipt["not_erased"] == {} and receipt["removed"]["backups"] == 0, "no backup to scrub yet"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM curated_memory WHERE owner = 'telegram:7'").fetchone() == (
            0,
        )
    assert not (home / "state.db").exists()


def _doctor_line(home: Path, url: str, name: str) -> str:
    out = mnemo(home, "doctor", MNEMO_DATABASE_URL=url, MNEMO_WEB_PORT="0")
    assert "Traceback" not in out.stderr, out.stderr
    (line,) = [line for line in out.stdout.splitlines() if line.split(" ", 1)[-1].startswith(f"{name}: ")]
    assert "state.db" not in out.stdout, out.stdout
    return line


def test_doctor_checks_the_postgresql_server_instead_of_state_db(pg_cluster: Cluster, home: Path) -> None:
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS

    url = pg_cluster.fresh_database()
    empty = _doctor_line(home, url, "postgresql")
    assert empty.startswith(("✓", "OK")) and "no mnemo schema yet" in empty, empty
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT to_regclass('schema_migrations')").fetchone() == (None,), (
            "doctor wrote nothing"
        )

    assert mnemo(home, "users", "list", MNEMO_DATABASE_URL=url).returncode == 0  # applies the schema
    steps = len(PG_MIGRATIONS)
    current = _doctor_line(home, url, "postgresql")
    assert current.startswith(("✓", "OK")), current
    assert (
        "reachable, PostgreSQL 1" in current
        and f"schema step {steps} of {steps} ({PG_MIGRATIONS[-1].name})" in current
    )
    memories = _doctor_line(home, url, "memories")
    assert "rows on PostgreSQL" in memories and memories.startswith(("–", "SKIP"))

    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, '0099_future')", (steps + 1,))
    newer = _doctor_line(home, url, "postgresql")
    assert newer.startswith(("✗", "FAIL")) and f"schema step {steps + 1} (0099_future) is newer" in newer, (
        newer
    )

    gone = _doctor_line(home, pg_cluster.url("no_such_database"), "postgresql")
    assert gone.startswith(("✗", "FAIL")) and "unreachable" in gone and "no_such_database" in gone, gone
    assert not (home / "state.db").exists()
