"""The manual (issue 31, item 5): README.md stays a short overview, docs/ builds with
``mkdocs build --strict`` offline (broken internal links and anchors fail it), and the
command reference docs/cli.md is the one generated from the CLI's own parser."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnemo.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CLI_MD = ROOT / "docs" / "cli.md"


def commands(
    parser: argparse.ArgumentParser, path: str = "mnemo"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every (path, parser) of the CLI, walked here independently of the generator."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, child in action.choices.items():
                if id(child) not in seen:  # an alias names the same parser
                    seen.add(id(child))
                    yield from commands(child, f"{path} {name}")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # Not -q: mkdocs counts --strict's warnings through its log, which -q silences.
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )


def test_readme_is_an_overview_with_the_two_commands_near_the_top() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; the manual is docs/"
    head = "\n".join(lines[:40])
    assert "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/mnemo run" in head
    assert "\nbash tests/run.sh\n" in head
    assert (ROOT / ".ci" / "run").read_text(encoding="utf-8").rstrip().endswith("exec bash tests/run.sh")


def test_readme_links_into_docs_reach_existing_pages_and_anchors() -> None:
    # mkdocs checks docs/ only; the README's links are checked here.
    links = re.findall(
        r"\]\(((?:docs/|CHANGELOG)[^)#\s]*)(?:#([\w-]+))?\)", README.read_text(encoding="utf-8")
    )
    assert len(links) >= 20, links
    for target, anchor in links:
        page = ROOT / target
        assert page.is_file(), f"README links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
            slugs = {re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", h.lower()).strip()) for h in headings}
            assert anchor in slugs, f"README links to {target}#{anchor}: no such heading"


def test_the_manual_builds_strict_and_offline(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = mkdocs_build(ROOT / "mkdocs.yml", site)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "index.html").is_file() and (site / "cli" / "index.html").is_file()
    assert (site / "dashboard" / "overview.png").is_file()  # the screenshots the pages show
    # theme.font: false — no page asks a font service for anything.
    for page in site.rglob("*.html"):
        assert "fonts.googleapis.com" not in page.read_text(encoding="utf-8"), page


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.png"))
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "security.md"
    page.write_text(
        page.read_text(encoding="utf-8") + "\n[gone](memory/curated.md#no-such-heading)\n", encoding="utf-8"
    )
    done = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-heading" in done.stdout + done.stderr


def test_the_committed_command_reference_is_a_fresh_generation() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_cli_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "40"},  # the terminal's width changes nothing
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_command_reference_lists_every_command_and_flag() -> None:
    text = CLI_MD.read_text(encoding="utf-8")
    sections = re.split(r"^#{2,5} `(mnemo[^`]*)`$", text, flags=re.M)
    by_path = dict(zip(sections[1::2], sections[2::2], strict=True))
    walked = list(commands(build_parser()))
    assert len(walked) > 60  # every level, sub-commands of sub-commands included
    for path, parser in walked:
        assert path in by_path, f"{path} is missing from docs/cli.md"
        section = by_path[path]
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                assert re.search(rf"(`|, ){re.escape(flag)}[ ,`]", section), (
                    f"{path} {flag} is missing from docs/cli.md"
                )


def test_every_command_lists_its_sub_commands_in_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    for path, parser in commands(build_parser()):
        names = [n for a in parser._actions if isinstance(a, argparse._SubParsersAction) for n in a.choices]
        if not names:
            continue
        with pytest.raises(SystemExit) as exited:
            main([*path.split()[1:], "--help"])
        assert exited.value.code == 0
        shown = capsys.readouterr().out
        for name in names:
            assert re.search(rf"^\s+{re.escape(name)}(\s|$)", shown, re.M), f"`{path} --help` omits {name}"
