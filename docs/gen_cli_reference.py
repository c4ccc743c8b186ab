"""Write docs/cli.md, the command reference, from the CLI's own argparse parser.

Every command, sub-command, argument and flag of ``mnemo`` with its help text, walked
from ``mnemo.cli.main.build_parser()`` — so the reference cannot drift from the CLI.

    .venv/bin/python docs/gen_cli_reference.py           # rewrite docs/cli.md
    .venv/bin/python docs/gen_cli_reference.py --check   # exit 1 when docs/cli.md is stale

tests/test_docs.py runs the check: change a command, regenerate, commit both.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parent / "cli.md"
WIDTH = 88  # usage lines are wrapped at a fixed width, whatever the terminal's

HEADER = """\
# Command reference

Generated from `mnemo`'s own parser by `docs/gen_cli_reference.py`; do not edit by hand
(`.venv/bin/python docs/gen_cli_reference.py` rewrites it; a test fails while it is stale).
`mnemo --help` and `mnemo COMMAND --help` print the same help in a terminal.

Exit codes: 0 done, 1 refused or failed, 2 usage or configuration error.
"""


@dataclass(frozen=True, slots=True)
class Command:
    path: str  # "mnemo backup verify"
    parser: argparse.ArgumentParser
    help: str  # the one line the parent's list shows
    children: tuple[tuple[str, str], ...]  # (path, help) of its sub-commands


def walk(parser: argparse.ArgumentParser, path: str = "mnemo", help: str = "") -> Iterator[Command]:
    """Every command of ``parser``, depth first, the root first; aliases once."""
    found: list[tuple[str, str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen: set[int] = set()
            for name, child in action.choices.items():
                if id(child) not in seen:
                    seen.add(id(child))
                    found.append((f"{path} {name}", helps.get(name, ""), child))
    yield Command(path, parser, help, tuple((p, h) for p, h, _ in found))
    for child_path, child_help, child in found:
        yield from walk(child, child_path, child_help)


def _formatter(prog: str) -> argparse.HelpFormatter:
    try:  # Python 3.14 colours help on a terminal; never in a file
        return argparse.HelpFormatter(prog, width=WIDTH, color=False)  # type: ignore[call-arg]  # 3.14+
    except TypeError:
        return argparse.HelpFormatter(prog, width=WIDTH)


def usage(parser: argparse.ArgumentParser) -> str:
    fmt = _formatter(parser.prog)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return fmt.format_help().strip()


def _cell(text: str) -> str:
    """One line of Markdown that shows ``text`` as written (in a table cell too)."""
    text = " ".join(text.split())
    for raw, escaped in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("*", "\\*"), ("|", "\\|")):
        text = text.replace(raw, escaped)
    return text


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(action.option_strings)
        if action.nargs == 0:
            return f"`{names}`"
        metavar = action.metavar or (action.dest.upper() if action.choices is None else None)
        if metavar is None:
            metavar = "{" + ",".join(str(c) for c in action.choices or ()) + "}"
        return f"`{names} {metavar if isinstance(metavar, str) else ' '.join(metavar)}`"
    name = action.metavar or action.dest
    return f"`{name if isinstance(name, str) else ' '.join(name)}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = _formatter(parser.prog)._expand_help(action) if action.help else ""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        text = f"{text} (one of: {', '.join(str(c) for c in action.choices)})".strip()
    return _cell(text)


def _anchor(path: str) -> str:
    return path.replace(" ", "-")


def section(command: Command) -> str:
    parser = command.parser
    level = "#" * min(5, command.path.count(" ") + 2)
    lines = [f"{level} `{command.path}`", ""]
    about = parser.description or command.help
    if about:
        lines += [_cell(about), ""]
    lines += ["```text", usage(parser), "```", ""]
    rows = [
        (_argument(a), _help(parser, a))
        for a in parser._actions
        if a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)
    ]
    if rows:
        lines += ["| argument | what it does |", "|---|---|"]
        lines += [f"| {name} | {text} |" for name, text in rows]
        lines.append("")
    if command.children:
        lines += ["| command | what it does |", "|---|---|"]
        lines += [f"| [`{p}`](#{_anchor(p)}) | {_cell(h)} |" for p, h in command.children]
        lines.append("")
    if parser.epilog:
        lines += [_cell(parser.epilog), ""]
    return "\n".join(lines)


def render() -> str:
    from mnemo.cli.main import build_parser

    return HEADER + "\n" + "\n".join(section(c) for c in walk(build_parser())).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run python docs/gen_cli_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
