"""The quick commands import no heavy library (issue 11, item 7).

``mnemo --help``, every ``COMMAND --help`` and ``ACTION --help``, and the read-only
commands an operator types all day (``memory show``, ``sessions list``/``search``,
``cron list``) must not pay for the LLM SDK, the platform SDKs, aiohttp, numpy or
APScheduler: those are imported by the handlers that use them. Each case runs
``mnemo.cli.main.main`` in a fresh interpreter (``sys.modules`` starts empty) against
a profile holding a session, a memory entry and a cron job, so the commands do their
real work, and reports the exit code and which heavy top-level packages got loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnemo.cli.main import build_parser, main

HEAVY = frozenset({"anthropic", "telegram", "discord", "aiohttp", "numpy", "apscheduler", "httpx"})

# Runs each argv in turn; after each one, prints its exit code and the heavy packages
# loaded so far (so the first non-empty set names the command that pulled them in).
PROBE = """
import json, sys
import mnemo.cli.main as cli
heavy = set(json.loads(sys.argv[1]))
results = []
for argv in json.loads(sys.argv[2]):
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    results.append({"argv": argv, "code": code, "heavy": sorted({m.split(".")[0] for m in sys.modules} & heavy)})
print("\\nPROBE " + json.dumps(results))
"""

CHAT = {
    "sessions": [
        {
            "id": "s1",
            "started_at": "2024-03-01T10:00:00",
            "messages": [
                {"id": "m1", "speaker": "Ann", "content": "I switched from coffee to green tea"},
                {"id": "m2", "speaker": "assistant", "content": "Green tea it is."},
            ],
        }
    ]
}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


COMMANDS = sorted(_subcommands(build_parser()))


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A profile with one imported session, one MEMORY.md entry and one cron job."""
    home = tmp_path_factory.mktemp("import-cost") / "home"
    home.mkdir()
    chat = home.parent / "chat.json"
    chat.write_text(json.dumps(CHAT))
    assert main(["--home", str(home), "sessions", "import", str(chat), "--chat", "telegram:dm:7"]) == 0
    assert main(["--home", str(home), "memory", "add", "--target", "memory", "Ann drinks green tea"]) == 0
    assert (
        main(
            ["--home", str(home), "cron", "add", "--chat", "telegram:7", "--every", "1h", "water the plants"]
        )
        == 0
    )
    yield home


def probe(home: Path, *argvs: list[str]) -> tuple[str, list[dict[str, object]]]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
    }
    env["MNEMO_HOME"] = str(home)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(sorted(HEAVY)), json.dumps(list(argvs))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out, _, report = proc.stdout.rpartition("\nPROBE ")
    return out, json.loads(report)


@pytest.mark.parametrize(
    ("argv", "expected_out"),
    [
        pytest.param(argv, expected_out, id=" ".join(argv))
        for argv, expected_out in [
            (["--help"], "COMMAND"),
            (["memory", "--help"], "ACTION"),
            (["memory", "show"], "Ann drinks green tea"),
            (["sessions", "list"], "telegram:dm:7"),
            (["sessions", "search", "tea"], "green tea"),
            (["cron", "list"], "water the plants"),
            (["facts", "--help"], "ACTION"),
        ]
    ],
)
def test_everyday_command_imports_nothing_heavy(profile: Path, argv: list[str], expected_out: str) -> None:
    out, [result] = probe(profile, argv)
    assert expected_out.lower() in out.lower()
    assert result["code"] == 0
    assert result["heavy"] == []


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_imports_nothing_heavy(profile: Path, command: str) -> None:
    out, [result] = probe(profile, [command, "--help"])
    assert f"usage: mnemo {command}" in out
    assert result["code"] == 0
    assert result["heavy"] == []


def test_every_action_help_imports_nothing_heavy(profile: Path) -> None:
    """All ``COMMAND ACTION --help`` screens in one interpreter: the loaded set only grows,
    so an empty set after the last one means none of them imported anything heavy."""
    actions = [
        [command, action, "--help"]
        for command, parser in _subcommands(build_parser()).items()
        for action in _subcommands(parser)
    ]
    assert len(actions) >= 10  # memory, sessions, cron, facts, pair, ... have actions
    _, results = probe(profile, *actions)
    assert [(r["argv"], r["code"], r["heavy"]) for r in results] == [(argv, 0, []) for argv in actions]
