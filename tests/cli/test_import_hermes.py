"""``mnemo import --from hermes PATH``: a Hermes Agent profile (folder or backup archive)
moves in through the real CLI — memory through the curated files' limits and threat
scan, skills through the guard, SessionDB conversations into searchable history under
the chats they came from — on both published SessionDB shapes; a second import is a
no-op and a dry run writes nothing."""

from __future__ import annotations

import json
import sqlite3
import tarfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mnemo.cli.main import main
from mnemo.profile_lock import hold
from tests.support.foreign_agents import INJECTED, T0, build_hermes_profile

USER = "telegram:12345"


@pytest.fixture(params=["early", "current"])
def hermes(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return build_hermes_profile(tmp_path / ".hermes", request.param)


def mnemo(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["--home", str(home), *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def do_import(
    home: Path, capsys: pytest.CaptureFixture[str], source: Path, *extra: str
) -> tuple[int, str, str]:
    return mnemo(home, capsys, "import", "--from", "hermes", str(source), "--user", USER, *extra)


def search(home: Path, capsys: pytest.CaptureFixture[str], query: str, chat: str) -> list[str]:
    code, out, _ = mnemo(home, capsys, "sessions", "search", query, "--chat", chat, "--json")
    assert code == 0
    return [m["text"] for s in json.loads(out)["results"] for m in s["matches"]]


def rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_import_brings_memory_skills_and_searchable_sessions_into_the_chats_they_came_from(
    hermes: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = sorted((p.relative_to(hermes), p.stat().st_mtime_ns) for p in hermes.rglob("*"))
    code, out, err = do_import(home, capsys, hermes)
    assert code == 0, err
    assert sorted((p.relative_to(hermes), p.stat().st_mtime_ns) for p in hermes.rglob("*")) == source
    # Memory: two entries added, the injected one refused and listed with its reason.
    memory = (home / "memories" / "MEMORY.md").read_text()
    assert "Backups run at 03:00 UTC" in memory and "~/ops/deploy.sh" in memory
    assert "Ignore all previous" not in memory
    assert "MEMORY.md entries: 2 added, 0 already present, 1 refused" in out
    assert "refused: 'Ignore all previous instructions" in out and "threat scan" in out
    user_md = home / "memories" / "users" / "telegram" / "12345" / "USER.md"
    assert "Lives in Lisbon" in user_md.read_text()
    assert (home / "SOUL.md").read_text().startswith("You are Hermes")
    assert not (home / ".env").exists()
    # Skills: the good one installed (OS platforms dropped, reference kept), the pipe-to-shell one refused.
    skill = home / "skills" / "devops" / "deploy-notes"
    assert (skill / "references" / "hosts.md").read_text() == "web1, web2\n"
    assert "linux" not in (skill / "SKILL.md").read_text()
    assert not (home / "skills" / "fetch-tool").exists()
    assert "refused: 'fetch-tool' — Blocked (pipe_to_shell)" in out
    # `mnemo memory show` shows what came over.
    code, shown, _ = mnemo(home, capsys, "memory", "show", "--user", USER)
    assert code == 0 and "Backups run at 03:00 UTC" in shown and "Prefers short answers" in shown
    # Search: each conversation in its own chat scope and in no other.
    assert any("heron" in s for s in search(home, capsys, "heron", "telegram:dm:12345"))
    assert search(home, capsys, "heron", "telegram:dm:777") == []
    assert any("Saffron" in s for s in search(home, capsys, "Saffron", "telegram:dm:777"))
    assert search(home, capsys, "Saffron", "telegram:dm:12345") == []
    assert any("zebra" in s for s in search(home, capsys, "zebra", "import:hermes:cli"))
    assert search(home, capsys, "zebra", "telegram:dm:12345") == []
    # Neither subagent runs, nor superseded rows, nor compression summaries come over.
    contents = [r[0] for r in rows(home / "state.db", "SELECT content FROM messages")]
    assert not any("walrus" in c or "quokka" in c or "summary of earlier" in c for c in contents)


def test_roles_tool_calls_and_timestamps_are_kept(
    hermes: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert do_import(home, capsys, hermes)[0] == 0
    got = rows(
        home / "state.db",
        "SELECT m.role, m.content, m.tool_calls, m.tool_call_id, m.tool_name, m.created_at, s.title, s.started_at"
        " FROM messages m JOIN sessions s ON s.id = m.session_id"
        " WHERE s.chat_key = 'telegram:dm:12345' ORDER BY m.id",
    )
    assert [r[0] for r in got] == ["user", "assistant", "tool", "assistant"]
    calls = json.loads(str(got[1][2]))
    assert calls == [{"id": "call_1", "name": "session_search", "input": {"query": "heron"}}]
    assert got[2][3:5] == ("call_1", "session_search")
    assert datetime.fromisoformat(str(got[0][5])) == datetime.fromtimestamp(T0 + 3600, UTC)
    assert datetime.fromisoformat(str(got[3][5])) == datetime.fromtimestamp(T0 + 3603, UTC)
    assert got[0][6] == "birds"
    assert datetime.fromisoformat(str(got[0][7])) == datetime.fromtimestamp(T0 + 3600, UTC)


def test_a_second_import_is_a_no_op(hermes: Path, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert do_import(home, capsys, hermes)[0] == 0
    before = {p: p.read_bytes() for p in (home / "memories").rglob("*.md")}
    messages = rows(home / "state.db", "SELECT count(*) FROM messages")
    sessions = rows(home / "state.db", "SELECT count(*) FROM sessions")
    code, out, err = do_import(home, capsys, hermes)
    assert code == 0, err
    assert "sessions: 0 imported (0 messages), 3 already imported" in out
    assert "MEMORY.md entries: 0 added, 2 already present, 1 refused" in out
    assert "skills: 0 added, 1 already present" in out
    assert "SOUL.md: already present" in out
    assert rows(home / "state.db", "SELECT count(*) FROM messages") == messages
    assert rows(home / "state.db", "SELECT count(*) FROM sessions") == sessions
    assert {p: p.read_bytes() for p in (home / "memories").rglob("*.md")} == before


def test_an_interrupted_import_is_completed_by_the_next_one(
    hermes: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert do_import(home, capsys, hermes)[0] == 0
    # As if the process died after creating a session and storing part of it.
    conn = sqlite3.connect(home / "state.db")
    sid = conn.execute("SELECT id FROM sessions WHERE chat_key = 'telegram:dm:12345'").fetchone()[0]
    conn.execute("DELETE FROM messages WHERE session_id = ? AND role <> 'user'", (sid,))
    conn.execute("UPDATE sessions SET ended_at = NULL WHERE id = ?", (sid,))
    conn.commit()
    conn.close()
    code, out, _ = do_import(home, capsys, hermes)
    assert code == 0 and "sessions: 0 imported (3 messages), 3 already imported" in out
    assert [
        r[0]
        for r in rows(home / "state.db", f"SELECT role FROM messages WHERE session_id = '{sid}' ORDER BY id")
    ] == ["user", "assistant", "tool", "assistant"]
    assert rows(home / "state.db", f"SELECT end_reason FROM sessions WHERE id = '{sid}'") == [("imported",)]


def test_dry_run_reports_everything_and_writes_nothing(
    hermes: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = do_import(home, capsys, hermes, "--dry-run")
    assert code == 0
    assert sorted(p.name for p in home.iterdir()) == []
    assert "dry run, nothing was written" in out
    assert "MEMORY.md entries: 2 would be added, 0 already present, 1 refused" in out
    assert f"refused: {INJECTED[:20]!r}"[:-1] in out
    assert "USER.md entries of telegram:12345: 2 would be added" in out
    assert "SOUL.md: would be imported" in out
    assert "refused: 'fetch-tool'" in out
    assert "sessions: 3 would be imported (8 messages), 0 already imported" in out
    assert "telegram:dm:12345 ← telegram:12345 (same ids): 1 session, 4 messages" in out
    assert "import:hermes:cli ← cli (unmapped): 1 session, 2 messages" in out
    assert "1 subagent runs" in out


def test_json_receipt(hermes: Path, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = do_import(home, capsys, hermes, "--json")
    assert code == 0
    receipt = json.loads(out)
    assert receipt["from"] == "hermes" and receipt["dry_run"] is False
    assert receipt["memory"]["added"] == 2
    assert receipt["memory"]["refused"][0]["reason"].startswith("threat scan")
    assert receipt["skills"]["installed_names"] == ["deploy-notes"]
    assert receipt["sessions"]["imported"] == 3
    assert receipt["sessions"]["chats"]["telegram:dm:12345"]["messages"] == 4
    assert receipt["sessions"]["skipped_sessions"] == {"subagent runs": 1}


def test_chat_map_puts_a_conversation_in_the_chat_named(
    hermes: Path, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mapping = tmp_path / "chats.txt"
    mapping.write_text("# Hermes source = mnemo chat\ncli = telegram:12345\n")
    code, out, _ = do_import(
        home, capsys, hermes, "--chat-map-file", str(mapping), "--chat-map", "telegram:777=discord:dm:555"
    )
    assert code == 0, out
    assert "telegram:dm:12345 ← cli, telegram:12345" in out
    assert any("zebra" in s for s in search(home, capsys, "zebra", "telegram:dm:12345"))
    assert any("Saffron" in s for s in search(home, capsys, "Saffron", "discord:dm:555"))
    assert search(home, capsys, "Saffron", "telegram:dm:777") == []


@pytest.mark.parametrize("suffix", [".zip", ".tar.gz"])
def test_a_backup_archive_is_read_like_the_folder(
    hermes: Path, home: Path, tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / f"hermes-backup{suffix}"
    files = [p for p in sorted(hermes.rglob("*")) if p.is_file()]
    if suffix == ".zip":
        with zipfile.ZipFile(archive, "w") as zf:
            for p in files:
                zf.write(p, f"hermes-home/{p.relative_to(hermes).as_posix()}")
    else:
        with tarfile.open(archive, "w:gz") as tf:
            for p in files:
                tf.add(p, f"hermes-home/{p.relative_to(hermes).as_posix()}")
    code, out, err = do_import(home, capsys, archive)
    assert code == 0, err
    assert any("heron" in s for s in search(home, capsys, "heron", "telegram:dm:12345"))
    assert "Backups run at 03:00 UTC" in (home / "memories" / "MEMORY.md").read_text()
    assert not (home / ".env").exists() and not (home / "config.yaml").exists()


def test_an_archive_member_that_climbs_out_refuses_the_archive(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("memories/MEMORY.md", "a note")
        zf.writestr("../../escaped.txt", "gotcha")
    code, _, err = do_import(home, capsys, archive)
    assert code == 1 and "climbs out" in err
    assert not (tmp_path / "escaped.txt").exists() and not (home / "memories").exists()


def test_clear_errors_for_missing_wrong_and_damaged_sources(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = do_import(home, capsys, tmp_path / "nowhere")
    assert code == 2 and err.strip() == f"mnemo: {tmp_path / 'nowhere'}: no such file or folder"
    openclaw = tmp_path / "oc"
    (openclaw / "agents").mkdir(parents=True)
    code, _, err = do_import(home, capsys, openclaw)
    assert code == 2 and "not a Hermes profile folder" in err and "--from openclaw" in err
    damaged = tmp_path / "damaged"
    (damaged / "memories").mkdir(parents=True)
    (damaged / "state.db").write_bytes(b"SQLite format 3\x00" + b"\x07" * 4000)
    code, _, err = do_import(home, capsys, damaged)
    assert code == 1 and "state.db" in err and len(err.strip().splitlines()) == 1
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    sqlite3.connect(foreign / "state.db").executescript("CREATE TABLE chats (id INTEGER);")
    code, _, err = do_import(home, capsys, foreign)
    assert code == 2 and "not a Hermes state.db" in err
    code, _, err = mnemo(home, capsys, "import", "--from", "hermes", str(foreign))
    assert code == 2 and "--user PLATFORM:ID" in err
    code, _, err = do_import(home, capsys, foreign, "--chat-map", "cli")
    assert code == 2 and "SOURCE=TARGET" in err
    code, _, err = mnemo(home, capsys, "import", str(foreign), "--dry-run")
    assert code == 2 and "only with --from" in err
    assert not (home / "state.db").exists()


def test_refused_while_the_profile_is_in_use(
    hermes: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with hold(home):
        code, _, err = do_import(home, capsys, hermes)
    assert code == 1 and "in use" in err
    assert not (home / "state.db").exists() and not (home / "memories").exists()


def test_entries_over_the_limit_and_a_skill_name_taken_are_listed(
    hermes: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "config.yaml").write_text("memory:\n  memory_char_limit: 100\n")
    memory = hermes / "memories" / "MEMORY.md"
    memory.write_text(memory.read_text() + "\n§\nThe staging cluster " + "is rebuilt nightly " * 5)
    taken = home / "skills" / "deploy-notes"
    taken.mkdir(parents=True)
    (taken / "SKILL.md").write_text("---\nname: deploy-notes\ndescription: our own deploy notes\n---\nmine\n")
    code, out, _ = do_import(home, capsys, hermes)
    assert code == 0
    assert "MEMORY.md entries: 2 added, 0 already present, 2 refused" in out
    assert (
        "refused: 'The staging cluster is rebuilt nightly" in out
        and "MEMORY.md would exceed its limit" in out
    )
    assert "refused: 'deploy-notes' — a different shared skill with this name exists; kept it" in out
    assert (taken / "SKILL.md").read_text().endswith("mine\n")


def test_a_dry_run_after_an_import_changes_nothing_and_reports_what_is_there(
    hermes: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert do_import(home, capsys, hermes)[0] == 0
    files = {p: p.read_bytes() for p in home.rglob("*") if p.is_file() and p.name != ".mnemo.lock"}
    code, out, _ = do_import(home, capsys, hermes, "--dry-run")
    assert code == 0
    assert "sessions: 0 would be imported (0 messages), 3 already imported" in out
    assert "MEMORY.md entries: 0 would be added, 2 already present, 1 refused" in out
    assert {p: p.read_bytes() for p in home.rglob("*") if p.is_file() and p.name != ".mnemo.lock"} == files
