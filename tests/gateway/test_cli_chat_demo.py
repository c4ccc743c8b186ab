"""`mnemo chat` (scripted stdin) and `mnemo demo`, run as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

MNEMO = [sys.executable, "-m", "mnemo"]


def _env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
    }
    env["MNEMO_HOME"] = str(home)
    return env


def test_scripted_chat_answers_each_line_in_order_and_remembers(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = "Hello there\nPlease remember that I like green tea\n/memory\n"
    out = subprocess.run(
        [*MNEMO, "chat", "--user", "bob"],
        input=script,
        capture_output=True,
        text=True,
        env=_env(home),
        timeout=60,
    )
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
        out = subprocess.run(
            [*MNEMO, "chat", "--user", "bob"],
            input=line + "\n",
            capture_output=True,
            text=True,
            env=_env(home),
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
    import sqlite3

    db = sqlite3.connect(home / "state.db")
    sessions = db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    users = [r[0] for r in db.execute("SELECT content FROM messages WHERE role='user' ORDER BY id")]
    assert sessions == 1 and users == ["first message about zebras", "second message"]


def test_bad_user_name_is_a_usage_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [*MNEMO, "chat", "--user", "../etc"],
        input="",
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
    )
    assert out.returncode == 2 and "--user" in out.stderr


def test_demo_runs_offline_and_reports_memory_search_and_cache(tmp_path: Path) -> None:
    out = subprocess.run(
        [*MNEMO, "demo"], capture_output=True, text=True, env=_env(tmp_path / "unused"), timeout=90
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "SCRIPTED" in text
    assert "User's name is Ada" in text  # memory written
    assert "query 'Lisbon'" in text and "Lisbon in May" in text  # search hits
    assert "read from cache" in text
    assert not (tmp_path / "unused").exists(), "the demo runs in a throw-away home"
