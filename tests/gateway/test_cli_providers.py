"""`mnemo providers list|setup` and `mnemo facts add|search|probe`."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mnemo.cli.main import main


def run(home: Path, *argv: str) -> int:
    return main(["--home", str(home), *argv])


# --- providers ---------------------------------------------------------------------------
def test_list_shows_name_state_and_description(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(home, "providers", "list") == 0
    out = capsys.readouterr().out
    assert "  holographic  available" in out
    assert "Local fact store" in out
    assert "no provider is active" in out


def test_list_marks_the_active_provider_and_explains_an_unavailable_one(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "config.yaml").write_text("memory:\n  provider: holographic\n")
    db = home / "providers" / "holographic" / "facts.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"not sqlite at all" * 64)
    assert run(home, "providers", "list") == 0
    out = capsys.readouterr().out
    assert f"* holographic  unavailable: {db} cannot be opened" in out


def test_list_refuses_when_the_configured_provider_is_missing(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "config.yaml").write_text("memory:\n  provider: nonesuch\n")
    assert run(home, "providers", "list") == 1
    assert "'nonesuch', which is not installed" in capsys.readouterr().out


def test_setup_with_set_writes_the_providers_own_config(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(home, "providers", "setup", "holographic", "--set", "dim=2048", "--set", "min_trust=0.25") == 0
    saved = json.loads((home / "providers" / "holographic" / "config.json").read_text())
    assert saved == {"dim": 2048, "min_trust": 0.25}
    out = capsys.readouterr().out
    assert "mnemo providers setup holographic --activate" in out  # tells the user how to activate it
    # A second run keeps what was set and changes only what is given.
    assert run(home, "providers", "setup", "holographic", "--set", "prefetch_limit=3") == 0
    saved = json.loads((home / "providers" / "holographic" / "config.json").read_text())
    assert saved == {"dim": 2048, "min_trust": 0.25, "prefetch_limit": 3}
    assert not (home / "config.yaml").exists()


def test_setup_with_activate_switches_the_provider_on_and_keeps_the_rest(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "config.yaml").write_text("gateway:\n  timezone: Europe/Lisbon\n")
    assert run(home, "providers", "setup", "holographic", "--set", "dim=2048", "--activate") == 0
    assert "holographic is now the active memory provider" in capsys.readouterr().out
    config = yaml.safe_load((home / "config.yaml").read_text())
    assert config == {"gateway": {"timezone": "Europe/Lisbon"}, "memory": {"provider": "holographic"}}
    assert run(home, "providers", "list") == 0
    assert "* holographic" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "dim=12"], "dim: 12 is below the minimum 64"),
        (["--set", "colour=red"], "unknown setting(s) colour"),
        (["--set", "novalue"], "--set expects KEY=VALUE"),
    ],
)
def test_setup_rejects_bad_values(
    home: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert run(home, "providers", "setup", "holographic", *argv) == 2
    assert message in capsys.readouterr().err
    assert not (home / "providers" / "holographic" / "config.json").exists()


def test_setup_of_an_unknown_provider(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(home, "providers", "setup", "mem9") == 2
    assert "unknown memory provider 'mem9'" in capsys.readouterr().err


def test_setup_prompts_on_a_terminal(home: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mnemo",
            "--home",
            str(home),
            "providers",
            "setup",
            "holographic",
            "--set",
            "dim=512",
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    # min_trust: a bad answer first (asked again), then 0.4; prefetch_limit 7; Enter keeps the
    # rest; then "n" to the question whether to activate it.
    os.write(master, b"lots\n0.4\n7\n\n\nn\n")
    output = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0, output.decode()
    text = output.decode()
    assert text.count("min_trust [0.3]:") == 2  # asked again after the bad answer
    assert "min_trust: expected a number, got 'lots'" in text
    assert "activate holographic now" in text and "not activated; later:" in text
    assert not (home / "config.yaml").exists()
    saved = json.loads((home / "providers" / "holographic" / "config.json").read_text())
    assert saved == {
        "dim": 512,
        "min_trust": 0.4,
        "prefetch_limit": 7,
        "decay_half_life_days": 0.0,
        "contradict_scan": 500,
    }


# --- facts ----------------------------------------------------------------------------------
def test_facts_add_search_probe_share_the_tools_code_path(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run(home, "facts", "add", "Alice lives in Paris.", "--user", "telegram:1", "--category", "person")
        == 0
    )
    assert "stored fact #1 (entities: Alice, Paris)" in capsys.readouterr().out
    assert run(home, "facts", "add", "Alice lives in Paris.", "--user", "telegram:1") == 0
    assert "already stored as fact #1" in capsys.readouterr().out
    assert run(home, "facts", "add", "The VPN endpoint is vpn.example.org.") == 0  # shared
    capsys.readouterr()

    assert run(home, "facts", "search", "where does Alice live?", "--user", "telegram:1", "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["results"][0]["content"] == "Alice lives in Paris."
    assert result["results"][0]["category"] == "person"

    assert run(home, "facts", "probe", "Alice", "--user", "telegram:1") == 0
    out = capsys.readouterr().out
    assert "#1" in out and "Alice lives in Paris." in out and "[person, user]" in out


def test_facts_are_scoped_to_the_user_given(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(home, "facts", "add", "Bob's door code is 2468.", "--user", "discord:42")
    run(home, "facts", "add", "The office closes at 18:00.")
    capsys.readouterr()
    assert run(home, "facts", "search", "door code office", "--user", "discord:7", "--json") == 0
    contents = [r["content"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert contents == ["The office closes at 18:00."]
    assert run(home, "facts", "search", "door code") == 0
    assert "no facts found" in capsys.readouterr().out


def test_facts_report_a_broken_store_and_bad_arguments(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(home, "facts", "search", "x", "--user", "no-colon") == 2
    assert "--user" in capsys.readouterr().err
    assert run(home, "facts", "search", "x", "--limit", "0") == 1
    assert "'limit'" in capsys.readouterr().out
    db = home / "providers" / "holographic" / "facts.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.write_bytes(b"garbage" * 100)
    assert run(home, "facts", "search", "anything") == 1
    assert "holographic is unavailable" in capsys.readouterr().err


def test_facts_work_from_a_fresh_process(home: Path) -> None:
    cmd = [sys.executable, "-m", "mnemo", "--home", str(home), "facts"]
    subprocess.run([*cmd, "add", "Carol's team ships on Thursdays."], check=True, capture_output=True)
    out = subprocess.run(
        [*cmd, "probe", "Carol", "--json"], check=True, capture_output=True, text=True
    ).stdout
    assert [f["content"] for f in json.loads(out)["facts"]] == ["Carol's team ships on Thursdays."]
