"""``mnemo memory history|revert``, ``mnemo users policy``, ``mnemo chats policy`` and the
erasure of a person's journal, on SQLite and PostgreSQL (the configured backend)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mnemo.cli.main import CommandError, main
from mnemo.cli.memory import parse_since
from tests.conftest import BackendUnderTest

ANA = "telegram:42"


def run(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main(["--home", str(home), *argv])
    out = capsys.readouterr().out
    try:
        return code, json.loads(out)
    except ValueError:
        return code, out


def test_history_lists_each_write_with_its_provenance_and_filters(
    home: Path, backend: BackendUnderTest, capsys: pytest.CaptureFixture[str]
) -> None:
    run(home, capsys, "memory", "add", "--target", "user", "--user", ANA, "Ana is a nurse")
    run(home, capsys, "memory", "replace", "--target", "user", "--user", ANA, "nurse", "Ana is a doctor")
    run(home, capsys, "memory", "add", "--target", "memory", "The wiki moved to /docs")
    code, rows = run(home, capsys, "memory", "history", "--json")
    assert code == 0 and [r["op"] for r in rows] == ["add", "replace", "add"]
    keys = {"id", "time", "layer", "target", "op", "old", "new", "actor", "trust", "session", "message"}
    assert all(keys <= set(r) for r in rows)
    assert {(r["actor"], r["trust"]) for r in rows} == {("cli", "admin")}
    _, mine = run(home, capsys, "memory", "history", "--user", ANA, "--json")
    assert [(r["op"], r["new"]) for r in mine] == [("replace", "Ana is a doctor"), ("add", "Ana is a nurse")]
    assert mine[1]["until"] == mine[0]["time"], "the replaced value keeps its until"
    _, recent = run(
        home, capsys, "memory", "history", "--since", "1d", "--layer", "curated", "--limit", "1", "--json"
    )
    assert len(recent) == 1
    _, none = run(home, capsys, "memory", "history", "--since", "2999-01-01", "--json")
    assert none == []
    code, text = run(home, capsys, "memory", "history", "--user", ANA)
    assert code == 0 and "replaced “Ana is a nurse” with “Ana is a doctor”" in text


def test_revert_undoes_one_entry_once(
    home: Path, backend: BackendUnderTest, capsys: pytest.CaptureFixture[str]
) -> None:
    run(home, capsys, "memory", "add", "--target", "user", "--user", ANA, "Ana likes jazz")
    [entry] = run(home, capsys, "memory", "history", "--json")[1]
    assert run(home, capsys, "memory", "revert", str(entry["id"]))[0] == 1, "not a tty: --yes is needed"
    code, out = run(home, capsys, "memory", "revert", str(entry["id"]), "--yes", "--json")
    assert code == 0 and out["success"] is True and out["reverted"] == entry["id"]
    code, rows = run(home, capsys, "memory", "history", "--json")
    assert rows[0]["reverts"] == entry["id"] and rows[0]["op"] == "remove" and rows[1]["undone"] is True
    assert run(home, capsys, "memory", "revert", str(entry["id"]), "--yes")[0] == 1
    assert run(home, capsys, "memory", "revert", "999999", "--yes")[0] == 1


def test_the_people_and_chat_policies(
    home: Path, backend: BackendUnderTest, capsys: pytest.CaptureFixture[str]
) -> None:
    code, shown = run(home, capsys, "users", "policy", ANA, "--json")
    assert code == 0 and (shown["remember"], shown["groups"]) == ("on", "private")
    _, set_ = run(home, capsys, "users", "policy", ANA, "--remember", "ask", "--json")
    _, set_ = run(home, capsys, "users", "policy", ANA, "--groups", "shared", "--json")
    assert (set_["remember"], set_["groups"], set_["set"]) == (
        "ask",
        "shared",
        {"remember": "ask", "groups": "shared"},
    )
    _, chat = run(
        home,
        capsys,
        "chats",
        "policy",
        "telegram:-1001234",
        "--remember",
        "off",
        "--history",
        "off",
        "--json",
    )
    assert (chat["chat"], chat["remember"], chat["history"]) == ("telegram:-1001234", "off", "off")
    code, text = run(home, capsys, "chats", "policy", "telegram:-999")
    assert code == 0 and "remember: on (default)" in text
    assert run(home, capsys, "chats", "policy", "no-colon")[0] == 2


def test_erasure_takes_a_persons_journal_and_leaves_a_receipt_naming_nobody(
    home: Path, backend: BackendUnderTest, capsys: pytest.CaptureFixture[str]
) -> None:
    run(home, capsys, "memory", "add", "--target", "user", "--user", ANA, "Ana is a nurse")
    run(home, capsys, "memory", "add", "--target", "user", "--user", "telegram:7", "Bo is a pilot")
    run(home, capsys, "users", "policy", ANA, "--remember", "ask")
    code, receipt = run(home, capsys, "users", "erase", ANA, "--yes", "--json")
    assert code == 0 and receipt["removed"]["journal"] == 1
    _, rows = run(home, capsys, "memory", "history", "--json")
    assert [(r["layer"], r["op"], r["target"], r["old"], r["new"]) for r in rows] == [
        ("journal", "erase", "erased", None, None),
        ("curated", "add", "telegram:7", None, "Bo is a pilot"),
    ]
    assert ANA not in json.dumps(rows)
    _, policy = run(home, capsys, "users", "policy", ANA, "--json")
    assert policy["set"] == {"remember": None, "groups": None}


def test_since_takes_an_age_a_date_or_a_time() -> None:
    now = datetime(2025, 3, 1, 12, tzinfo=UTC)
    assert parse_since("30m", now) == now - timedelta(minutes=30)
    assert parse_since("7d", now) == now - timedelta(days=7)
    assert parse_since("2025-02-01", now) == datetime(2025, 2, 1, tzinfo=UTC)
    assert parse_since("2025-02-01T08:00+01:00", now) == datetime(2025, 2, 1, 7, tzinfo=UTC)
    with pytest.raises(CommandError):
        parse_since("yesterday", now)
