"""CLI conventions (issue 31): ``--json`` on every read command, ``NO_COLOR``, every
command in ``mnemo --help``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from mnemo.cli.completion import nodes
from mnemo.cli.main import build_parser, main
from tests.gateway.test_cli_run import clean_env
from tests.support.pty_session import PtySession

REPO = Path(__file__).resolve().parents[2]


def run_json(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    code = main(["--home", str(home), *argv, "--json"])
    out = capsys.readouterr().out
    assert code in (0, 1), (argv, code)
    return json.loads(out)


def test_read_commands_print_json(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chat = tmp_path / "chat.json"
    chat.write_text(
        json.dumps(
            {"sessions": [{"id": "s1", "messages": [{"id": "m1", "speaker": "Ann", "content": "tea?"}]}]}
        )
    )
    assert main(["--home", str(home), "sessions", "import", str(chat), "--chat", "telegram:dm:7"]) == 0
    assert main(["--home", str(home), "memory", "add", "--target", "memory", "The server is in Porto"]) == 0
    skill = tmp_path / "tea"
    skill.mkdir()
    (skill / "SKILL.md").write_text("---\nname: tea\ndescription: brew tea\n---\nSteep.\n")
    assert main(["--home", str(home), "skills", "install", str(skill)]) == 0
    capsys.readouterr()

    doctor = run_json(home, capsys, "doctor", "--timeout", "0.5")
    assert isinstance(doctor, dict) and {c["name"] for c in doctor["checks"]} >= {"config", "home", "llm"}
    assert all(c["status"] in ("pass", "fail", "skip") for c in doctor["checks"])
    memory = run_json(home, capsys, "memory", "show", "--user", "telegram:7")
    assert memory["memory"]["entries"] == ["The server is in Porto"] and memory["user"]["entries"] == []
    assert run_json(home, capsys, "pair", "list") == []
    assert run_json(home, capsys, "backup", "list") == []
    [listed] = [json.loads(line) for line in _lines(home, capsys, "sessions", "list", "--json")]
    shown = run_json(home, capsys, "sessions", "show", listed["id"])
    assert shown["session"]["id"] == listed["id"] and shown["messages"][0]["content"] == "tea?"
    assert run_json(home, capsys, "skills", "history", "tea") == {"name": "tea", "versions": []}
    assert run_json(home, capsys, "skills", "show", "tea")["content"].endswith("Steep.\n")


def _lines(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(["--home", str(home), *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    commands = [n.path.split()[1] for n in nodes(build_parser()) if n.path.count(" ") == 1]
    assert {"setup", "completion", "backup", "migrate", "skills", "status", "users"} <= set(commands)
    assert all(f"    {name} " in text for name in commands), text


@pytest.mark.parametrize("no_color", ["", "1"])
async def test_doctor_colours_its_marks_on_a_terminal_unless_no_color(tmp_path: Path, no_color: str) -> None:
    env = {**clean_env(tmp_path, MNEMO_WEB_PORT="0"), "TERM": "xterm"}
    if no_color:
        env["NO_COLOR"] = no_color
    term = PtySession.spawn(
        [sys.executable, "-m", "mnemo", "--home", str(tmp_path / "home"), "doctor", "--timeout", "0.5"],
        env=env,
        cwd=REPO,
    )
    try:
        await term.expect(r"config: ")
        await asyncio.wait_for(term.wait(), 60)
    finally:
        term.kill()
    painted = "\x1b[32m✓\x1b[0m config:" in term.output
    assert painted is not bool(no_color), term.output
    if no_color:
        assert "\x1b[3" not in term.output, "no colour at all with NO_COLOR"


async def test_chat_on_a_terminal_shows_the_prompt_again_under_the_reply(tmp_path: Path) -> None:
    env = {**clean_env(tmp_path), "TERM": "xterm"}
    term = PtySession.spawn(
        [sys.executable, "-m", "mnemo", "--home", str(tmp_path / "home"), "chat", "--user", "ada"],
        env=env,
        cwd=REPO,
    )
    try:
        await term.expect(r"LOCAL TRIAL MODE[^\n]*\n(\x1b\[K)?you> ")  # the banner before the prompt
        term.send("hello there")
        # The reply replaces the waiting prompt, and the prompt comes back right under it.
        await term.expect(r"\x1b\[Kmnemo> \[scripted reply[^\n]*\n\n?you> ")
        os.write(term.master, b"\x04")  # Ctrl-D ends the chat
        assert await term.wait() == 0
    finally:
        term.kill()
