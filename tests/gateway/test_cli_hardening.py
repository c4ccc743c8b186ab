"""Hostile bytes at the CLI, run as real processes: undecodable stdin, surrogateescape'd
argv, and stored terminal escape sequences printed back."""

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
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def _mnemo(home: Path, *args: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*MNEMO, *args], input=stdin, capture_output=True, env=_env(home), timeout=60)


def test_undecodable_stdin_is_replaced_per_line_with_a_note_and_the_rest_is_answered(tmp_path: Path) -> None:
    out = _mnemo(tmp_path / "home", "chat", "--user", "bob", stdin=b"caf\xe9\nsecond line\n")
    assert out.returncode == 0, out.stderr
    replies = out.stdout.decode().strip().split("\n\n")
    assert len(replies) == 2, out.stdout
    assert "caf\ufffd" in replies[0] and "second line" in replies[1]
    assert b"line 1 is not valid UTF-8 (byte 0xe9" in out.stderr


def test_a_reply_never_writes_raw_escape_sequences_to_the_terminal(tmp_path: Path) -> None:
    out = _mnemo(tmp_path / "home", "chat", "--user", "bob", stdin=b"see \x1b[8mhidden\x1b[0m text\n")
    assert out.returncode == 0, out.stderr
    assert b"\x1b" not in out.stdout
    assert b"\\x1b[8mhidden" in out.stdout  # the trial emulator echoes the message


def test_stored_messages_with_escapes_are_shown_escaped_by_sessions_commands(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert (
        _mnemo(home, "chat", "--user", "bob", stdin=b"zebra \x1b]0;owned\x07 \x9b31m stripes\n").returncode
        == 0
    )
    listed = _mnemo(home, "sessions", "list")
    assert listed.returncode == 0, listed.stderr
    session_id = listed.stdout.split()[0].decode()
    for args in (
        ("sessions", "show", session_id),
        ("sessions", "search", "zebra"),
        ("sessions", "search", "zebra", "--json"),
    ):
        out = _mnemo(home, *args)
        assert out.returncode == 0, (args, out.stderr)
        text = out.stdout.decode()
        assert "zebra" in text, args
        assert not any(ch in text for ch in "\x1b\x07\x9b"), (args, text)


def test_memory_add_refuses_escapes_and_undecodable_argv_with_a_reason(tmp_path: Path) -> None:
    home = tmp_path / "home"
    esc = _mnemo(home, "memory", "add", "--target", "memory", "User likes \x1b[8mhidden tea")
    assert esc.returncode == 1, esc.stderr
    assert b"control_character" in esc.stdout and b"ESC" in esc.stdout
    assert b"\x1b" not in esc.stdout
    bad = _mnemo(home, "memory", "add", "--target", "memory", b"caf\xe9 au lait")
    assert bad.returncode == 1, bad.stderr
    assert b"invalid_text" in bad.stdout and b"Traceback" not in bad.stderr
    assert not (home / "memories" / "MEMORY.md").exists()


def test_a_memory_file_with_escapes_on_disk_still_loads_and_is_shown_escaped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    memories = home / "memories"
    memories.mkdir(parents=True)
    (memories / "MEMORY.md").write_text(
        "User likes tea\n§\nsecret \x1b[8mhidden\x1b[0m note", encoding="utf-8"
    )
    out = _mnemo(home, "memory", "show")
    assert out.returncode == 0, out.stderr
    assert b"\x1b" not in out.stdout and b"\x1b" not in out.stderr
    assert b"User likes tea" in out.stdout
    assert b"[BLOCKED: control_character]" in out.stdout  # the model never sees it
    assert b"\\x1b[8mhidden" in out.stderr  # the operator sees what is there


def test_facts_add_refuses_escapes_and_prints_no_raw_control_characters(tmp_path: Path) -> None:
    home = tmp_path / "home"
    out = _mnemo(home, "facts", "add", "Alice likes \x1b[8mhidden tea", "--user", "telegram:1")
    assert out.returncode == 1, out.stderr
    assert b"control_character" in out.stdout and b"\x1b" not in out.stdout
    assert _mnemo(home, "facts", "add", "Alice likes green tea", "--user", "telegram:1").returncode == 0
    found = _mnemo(home, "facts", "search", "Alice tea", "--user", "telegram:1")
    assert b"green tea" in found.stdout and b"hidden" not in found.stdout
