"""``mnemo import --from hermes|openclaw`` on both backends (issue 25 item 4): into a
SQLite profile and into a PostgreSQL one, memory, persona, skills and searchable
conversations arrive; a second import is a no-op, an interrupted one is completed by
the next, and a dry run writes nothing — the same on both. (``test_import_hermes.py``
and ``test_import_openclaw.py`` cover each source's details on SQLite.)"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from mnemo.cli.main import main
from mnemo.gateway.config import load_settings
from mnemo.gateway.storage import backend_for, open_backend
from tests.conftest import BackendUnderTest
from tests.support.foreign_agents import build_hermes_profile, build_openclaw_state

USER = "telegram:12345"


def mnemo(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--home", str(home), *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def hermes_import(
    home: Path, capsys: pytest.CaptureFixture[str], source: Path, *extra: str
) -> tuple[int, str, str]:
    return mnemo(home, capsys, "import", "--from", "hermes", str(source), "--user", USER, *extra)


def search(home: Path, capsys: pytest.CaptureFixture[str], query: str, chat: str) -> list[str]:
    code, out, _ = mnemo(home, capsys, "sessions", "search", query, "--chat", chat, "--json")
    assert code == 0
    return [m["text"] for s in json.loads(out)["results"] for m in s["matches"]]


def counts(home: Path) -> dict[str, int]:
    """Rows per table, read through the backend's archive store (read-only)."""
    rows = backend_for(load_settings(home, environ={})).archive().contents().rows
    return {label: n for label, n in rows.items() if n}


def forget_the_replies(home: Path, backend: BackendUnderTest, chat_key: str) -> None:
    """As if the import died after storing a session's first message: its other
    messages gone and the session not ended."""
    if backend.url is None:
        conn = sqlite3.connect(home / "state.db")
        sid = conn.execute("SELECT id FROM sessions WHERE chat_key = ?", (chat_key,)).fetchone()[0]
        conn.execute("DELETE FROM messages WHERE session_id = ? AND role <> 'user'", (sid,))
        conn.execute("UPDATE sessions SET ended_at = NULL WHERE id = ?", (sid,))
        conn.commit()
        conn.close()
        return
    import psycopg

    with psycopg.connect(backend.url) as conn:
        row = conn.execute("SELECT id FROM sessions WHERE chat_key = %s", (chat_key,)).fetchone()
        assert row is not None
        conn.execute("DELETE FROM messages WHERE session_id = %s AND role <> 'user'", (row[0],))
        conn.execute("UPDATE sessions SET ended_at = NULL WHERE id = %s", (row[0],))


async def roles(home: Path, chat_key: str) -> list[str]:
    storage = await open_backend(load_settings(home, environ={}))
    try:
        [session] = await storage.sessions.list_sessions(chat_key)
        return [m.role for m in await storage.sessions.load_messages(session.id)]
    finally:
        await storage.close()


def test_hermes_moves_in_on_either_backend_once_and_completes_an_interrupted_run(
    home: Path, backend: BackendUnderTest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hermes = build_hermes_profile(tmp_path / ".hermes", "current")
    code, out, err = hermes_import(home, capsys, hermes)
    assert code == 0, err
    assert "MEMORY.md entries: 2 added, 0 already present, 1 refused" in out
    assert "sessions: 3 imported (8 messages), 0 already imported" in out
    code, shown, _ = mnemo(home, capsys, "memory", "show", "--user", USER)
    assert "Backups run at 03:00 UTC" in shown and "Lives in Lisbon" in shown
    assert any("heron" in s for s in search(home, capsys, "heron", "telegram:dm:12345"))
    assert search(home, capsys, "heron", "telegram:dm:777") == []
    assert (home / "skills" / "devops" / "deploy-notes" / "SKILL.md").is_file()
    assert (home / "state.db").exists() == (backend.url is None), "on PostgreSQL nothing goes to state.db"
    assert not (home / "memories").exists() or backend.url is None, "nor to memory files"
    before = counts(home)

    code, out, err = hermes_import(home, capsys, hermes)
    assert code == 0, err
    assert "sessions: 0 imported (0 messages), 3 already imported" in out
    assert "MEMORY.md entries: 0 added, 2 already present, 1 refused" in out
    assert counts(home) == before, "a second import is a no-op"

    forget_the_replies(home, backend, "telegram:dm:12345")
    assert asyncio.run(roles(home, "telegram:dm:12345")) == ["user"]
    code, out, err = hermes_import(home, capsys, hermes)
    assert code == 0, err
    assert "sessions: 0 imported (3 messages), 3 already imported" in out
    assert asyncio.run(roles(home, "telegram:dm:12345")) == ["user", "assistant", "tool", "assistant"]
    assert counts(home) == before


def test_openclaw_moves_in_on_either_backend_and_a_dry_run_writes_nothing(
    home: Path, backend: BackendUnderTest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    openclaw = build_openclaw_state(tmp_path / ".openclaw")
    files_before = sorted(p.name for p in home.iterdir())
    code, out, err = mnemo(
        home, capsys, "import", "--from", "openclaw", str(openclaw), "--user", "telegram:4242", "--dry-run"
    )
    assert code == 0, err
    assert "dry run, nothing was written" in out
    assert "MEMORY.md entries: 3 would be added, 0 already present, 1 refused" in out
    assert sorted(p.name for p in home.iterdir()) == files_before
    assert counts(home) == {}, "the store holds nothing"

    code, out, err = mnemo(
        home, capsys, "import", "--from", "openclaw", str(openclaw), "--user", "telegram:4242"
    )
    assert code == 0, err
    assert "telegram:dm:4242 ← telegram:dm:4242 (same ids): 1 session, 4 messages" in out
    assert any("marmalade" in s for s in search(home, capsys, "marmalade", "telegram:dm:4242"))
    assert any("lighthouse" in s for s in search(home, capsys, "lighthouse", "import:openclaw:notes"))
    code, shown, _ = mnemo(home, capsys, "memory", "show")
    assert code == 0 and "oolong" in shown
    after = counts(home)
    code, out, err = mnemo(
        home, capsys, "import", "--from", "openclaw", str(openclaw), "--user", "telegram:4242", "--dry-run"
    )
    assert code == 0, err
    assert "MEMORY.md entries: 0 would be added, 3 already present, 1 refused" in out
    assert "already imported" in out and counts(home) == after
