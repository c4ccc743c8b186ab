"""``mnemo completion bash|zsh|fish``: generated from the parser, so every command and
flag is in it; each script parses in its own shell (``bash -n``, ``zsh -n``, ``fish
--no-execute``) and completes the words a person would type."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mnemo.cli.completion import nodes
from mnemo.cli.main import build_parser, main


@pytest.fixture
def scripts(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Path]:
    out = {}
    for shell in ("bash", "zsh", "fish"):
        assert main(["--home", str(home), "completion", shell]) == 0
        path = tmp_path / f"mnemo.{shell}"
        path.write_text(capsys.readouterr().out)
        out[shell] = path
    return out


def shell(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_script_parses_in_its_shell(scripts: dict[str, Path]) -> None:
    shell(["bash", "-n", str(scripts["bash"])])
    shell(["zsh", "-n", str(scripts["zsh"])])
    shell(["fish", "--no-execute", str(scripts["fish"])])


def test_every_command_and_flag_of_the_parser_is_in_every_script(scripts: dict[str, Path]) -> None:
    tree = list(nodes(build_parser()))
    assert {"mnemo setup", "mnemo completion", "mnemo backup verify", "mnemo doctor"} <= {
        n.path for n in tree
    }
    for path in scripts.values():
        text = path.read_text()
        for node in tree:
            assert node.path in text
            for flag in node.flags:
                assert all(name.lstrip("-") in text for name in flag.names), (
                    path.name,
                    node.path,
                    flag.names,
                )


def test_bash_completes_commands_actions_and_choices(scripts: dict[str, Path]) -> None:
    def complete(*words: str) -> list[str]:
        array = " ".join(f"'{w}'" for w in words)
        code = f"source {scripts['bash']}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _mnemo"
        code += '; echo "${COMPREPLY[@]}"'
        return shell(["bash", "-c", code]).split()

    assert complete("mnemo", "se") == ["sessions", "setup"]
    assert complete("mnemo", "--home", "/tmp/x", "backup", "ve") == ["verify"]
    assert complete("mnemo", "setup", "--backups", "") == ["on", "off"]
    assert "--non-interactive" in complete("mnemo", "setup", "--")


def test_zsh_completes_the_same_words(scripts: dict[str, Path]) -> None:
    stubs = 'compdef() { :; }; _describe() { print -rl -- ${(P)4}; }; compadd() { shift; print -rl -- "$@"; }'

    def complete(*words: str) -> list[str]:
        array = " ".join(f"'{w}'" for w in words)
        code = f"{stubs}; source {scripts['zsh']}; words=({array}); CURRENT={len(words)}; _mnemo"
        return [line.split(":", 1)[0] for line in shell(["zsh", "-c", code]).splitlines()]

    assert {"now", "list", "verify", "restore"} <= set(complete("mnemo", "backup", ""))
    assert complete("mnemo", "setup", "--backups", "") == ["on", "off"]


def test_fish_completes_the_same_words(scripts: dict[str, Path]) -> None:
    def complete(line: str) -> list[str]:
        out = shell(["fish", "--no-config", "-c", f"source {scripts['fish']}; complete -C '{line}'"])
        return [row.split("\t", 1)[0] for row in out.splitlines()]

    assert complete("mnemo backup ") == ["list", "now", "restore", "verify"]
    assert complete("mnemo setup --backups ") == ["off", "on"]
    assert "--non-interactive" in complete("mnemo setup --no")
