"""The small things a first-day user met (issue 31), each as the person meets it:
typed in a chat (loopback adapter → gateway → commands) or run from the shell."""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from mnemo.cli.main import main
from mnemo.gateway.budgets.gate import money
from mnemo.gateway.emulator import Reply
from mnemo.gateway.events import ChatType
from mnemo.memory.external import missing_package
from mnemo.memory.extras import install_hint
from mnemo.memory.scope import UserRef
from tests.gateway.test_slash_commands import converse
from tests.support.loopback import LoopbackAdapter

MODEL_WORDS = ("Current entries are listed", "do not repeat it", "use edit or patch", "system prompt")


async def test_forget_with_no_match_names_the_entries_it_looked_at(app_factory, emulator) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        [empty] = await converse(adapter, emulator, "/forget coffee")
        await asyncio.to_thread(app.files.user(UserRef("loop", "u1")).add, "Likes green tea")
        [listed] = await converse(adapter, emulator, "/forget coffee")
    assert empty == "Nothing to forget: your profile is empty, so nothing contains “coffee”."
    assert listed == "No entry of your profile contains “coffee”. Your entries:\n• Likes green tea"
    assert not any(w in empty + listed for w in MODEL_WORDS)


async def test_a_tenth_of_a_cent_cap_is_shown_as_set_not_as_zero(app_factory, emulator) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"budgets.per_user.daily_usd": 0.001}):
        [usage] = await converse(adapter, emulator, "/usage")
    assert "of $0.001" in usage and "$0.00 " not in usage, usage
    assert [money(v) for v in (0.001, 5, 2.5, 0.0015, 12.34)] == [
        "$0.001",
        "$5.00",
        "$2.50",
        "$0.0015",
        "$12.34",
    ]


@pytest.mark.parametrize(
    "typed",
    [
        "/cron add cron 0 8 * * * Good morning tz=Europe/Lisbon",
        "/cron add tz=Europe/Lisbon cron 0 8 * * * Good morning",
        "/cron add cron 0 8 * * * tz=Europe/Lisbon Good morning",
    ],
)
async def test_cron_add_takes_the_time_zone_wherever_it_is_typed(app_factory, emulator, typed: str) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        [answer] = await converse(adapter, emulator, typed)
        assert app.cron is not None
        [job] = await app.cron.store.all()
    assert answer.startswith("Scheduled"), answer
    assert job.prompt == "Good morning", "tz= is never part of the prompt"
    assert job.schedule.timezone == "Europe/Lisbon"
    assert job.next_run_at is not None and job.next_run_at.astimezone(ZoneInfo("Europe/Lisbon")).hour == 8


async def test_memory_in_a_group_promises_no_private_reply_the_platform_lacks(app_factory, emulator) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await asyncio.to_thread(app.files.user(UserRef("loop", "u1")).add, "Likes green tea")
        [answer] = await converse(adapter, emulator, "/memory", chat="room1", chat_type=ChatType.GROUP)
    assert "shown only to you" not in answer
    assert "direct message" in answer and "green tea" not in answer


async def test_help_lists_forget_me(app_factory, emulator) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        [text] = await converse(adapter, emulator, "/help")
    assert (
        "/forget me — erase everything I have of you"
        in text.splitlines()[[line.startswith("/forget ") for line in text.splitlines()].index(True) + 1]
    )


async def test_forget_me_says_that_the_pairing_goes_too(app_factory, emulator) -> None:
    emulator.default = lambda req: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"access.allowed": ()}) as app:
        pairings = app.access.pairings
        code = await pairings.request(UserRef("loop", "pat"), "Pat")
        assert await pairings.decide(code, True, by="loop:admin") is not None
        [hello] = await converse(adapter, emulator, "hello", user="pat")
        assert hello == "ok", "paired: Pat may talk to the bot"
        [ask] = await converse(adapter, emulator, "/forget me", user="pat")
        confirm = ask.split("/forget me ", 1)[1].split()[0]
        [done] = await converse(adapter, emulator, f"/forget me {confirm}", user="pat")
    assert "pairing" in ask and "will not answer you again" in ask
    assert done.startswith("Erased") and "pairing with this bot was erased too" in done


def test_skill_install_of_a_taken_name_says_what_to_do(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "tea"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: tea\ndescription: brew tea\n---\nSteep 3 minutes.\n")
    assert main(["--home", str(home), "skills", "install", str(folder)]) == 0
    capsys.readouterr()
    assert main(["--home", str(home), "skills", "install", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "mnemo skills remove tea" in err and not any(w in err for w in MODEL_WORDS), err


def test_backup_verify_without_a_file_checks_the_newest(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--home", str(home), "backup", "verify"]) == 2
    assert "no backups in" in capsys.readouterr().err
    assert main(["--home", str(home), "backup", "now"]) == 0
    newest = capsys.readouterr().out.splitlines()[0].rsplit(" ", 1)[1].strip()
    assert main(["--home", str(home), "backup", "verify"]) == 0
    assert capsys.readouterr().out.startswith(f"{newest}: OK")


def test_install_hints_name_the_interpreter_mnemo_runs_on() -> None:
    hint = install_hint("hindsight")
    assert hint == f"{shlex.quote(sys.executable)} -m pip install 'mnemo[hindsight]'"
    missing = missing_package("no_such_sdk_module_31", "no-such-sdk", "hindsight")
    assert missing is not None and not missing.ok
    assert missing.reason.endswith(hint), missing.reason
