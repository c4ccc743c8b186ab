"""`mnemo chat` (scripted stdin) and `mnemo demo`, through the command's entry point
(in process: tests/support/cli.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.support.cli import run_mnemo


def test_scripted_chat_answers_each_line_in_order_and_remembers(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = "Hello there\nPlease remember that I like green tea\n/memory\n"
    out = run_mnemo(home, "chat", "--user", "bob", stdin=script)
    assert out.returncode == 0, out.stderr
    first, second, rest = out.stdout.split("\n\n", 2)
    assert first.startswith("[scripted reply") and "Hello there" in first, "trial replies are labelled"
    assert second.startswith("[scripted reply") and "green tea" in second
    assert "USER PROFILE" in rest and "green tea" in rest, "the /memory command shows the saved fact"
    assert "SCRIPTED" in out.stderr
    user_md = home / "memories" / "users" / "cli" / "bob" / "USER.md"
    assert "green tea" in user_md.read_text()


def test_scripted_chat_continues_the_same_conversation_across_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for line in ("first message about zebras", "second message"):
        out = run_mnemo(home, "chat", "--user", "bob", stdin=line + "\n")
        assert out.returncode == 0, out.stderr
    db = sqlite3.connect(home / "state.db")
    sessions = db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    users = [r[0] for r in db.execute("SELECT content FROM messages WHERE role='user' ORDER BY id")]
    assert sessions == 1 and users == ["first message about zebras", "second message"]


def test_bad_user_name_is_a_usage_error(tmp_path: Path) -> None:
    out = run_mnemo(tmp_path, "chat", "--user", "../etc")
    assert out.returncode == 2 and "--user" in out.stderr


def test_demo_runs_offline_and_reports_memory_search_and_cache(tmp_path: Path) -> None:
    out = run_mnemo(tmp_path / "unused", "demo")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "SCRIPTED" in text
    assert "User's name is Ada" in text  # memory written
    assert 'session_search "Lisbon"' in text and "Lisbon in May" in text  # what the model read
    assert "read from cache" in text
    assert not (tmp_path / "unused").exists(), "the demo runs in a throw-away home"
