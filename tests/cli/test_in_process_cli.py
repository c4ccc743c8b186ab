"""The in-process ``mnemo`` of tests/support/cli.py behaves like a fresh process each
call: its own streams and environment, and the logging configuration ``main`` sets up
is gone afterwards (so later tests neither log into a closed stream nor at its level)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tests.support.cli import run_mnemo


def test_each_call_has_its_own_streams_and_leaves_logging_as_it_was(tmp_path: Path) -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    verbose = run_mnemo(tmp_path / "home", "chat", "--user", "ann", "--verbose", stdin="hello\n")
    assert verbose.returncode == 0 and '"level": "info"' in verbose.stderr, verbose.stderr
    assert (list(root.handlers), root.level) == before
    quiet = run_mnemo(tmp_path / "home", "chat", "--user", "ann", stdin="hello again\n")
    assert quiet.stderr.count("LOCAL TRIAL MODE") == 1 and '"level": "info"' not in quiet.stderr
    assert "hello again" in quiet.stdout and "hello again" not in verbose.stdout
    second = run_mnemo(tmp_path / "home", "sessions", "list")
    assert second.returncode == 0 and second.stderr == "", second.stderr
    assert "cli" in second.stdout  # the chat of the first call, read back from state.db


def test_the_hosts_mnemo_variables_do_not_reach_the_command(tmp_path: Path) -> None:
    os.environ["MNEMO_HOME"] = str(tmp_path / "elsewhere")
    try:
        out = run_mnemo(tmp_path / "home", "doctor", MNEMO_WEB_PORT="0")
    finally:
        del os.environ["MNEMO_HOME"]
    assert str(tmp_path / "home") in out.stdout and "elsewhere" not in out.stdout
    assert not (tmp_path / "elsewhere").exists()


def test_usage_errors_and_version_exit_like_the_command(tmp_path: Path) -> None:
    bad = run_mnemo(tmp_path / "home", "no-such-command")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    version = run_mnemo(tmp_path / "home", "--version")
    assert version.returncode == 0 and version.stdout.startswith("mnemo ")
