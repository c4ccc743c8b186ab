"""After a move to PostgreSQL, the backups hold what is said there (issue 25, "Done when").

End to end with python-telegram-bot's real ``Application`` against the fake Bot API and
the real anthropic SDK against the emulator: a Telegram DM on SQLite, ``mnemo migrate``,
the conversation goes on on PostgreSQL (and the profile grows there), ``mnemo backup
now``; the archive holds what was said after the move. Restored into an empty SQLite
home, ``mnemo sessions search`` finds it, and the next turn's prompt — in the same
session and in a new one — carries the person's profile as it was on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mnemo.cli.main import main
from mnemo.gateway.emulator import Emulator, Reply
from tests.adapters.telegram_harness import FlakyTelegram, TelegramRig
from tests.support.pgcluster import Cluster

CHAT = USER = 4711


@pytest.fixture
async def fake() -> AsyncIterator[FlakyTelegram]:
    async with FlakyTelegram(bot_username="mnemo_test_bot") as server:
        yield server


def cli(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    code = main(["--home", str(home), *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


async def turn(rig: TelegramRig, text: str) -> str:
    async with rig.app() as _:
        n = len(rig.fake.sent)
        rig.fake.push_text(CHAT, USER, text, first_name="Ada")
        return (await rig.fake.wait_for_sent(n + 1))[n].text


async def test_after_a_move_to_postgresql_the_backup_holds_what_was_said_and_restores_into_sqlite(
    fake: FlakyTelegram,
    emulator: Emulator,
    home: Path,
    tmp_path: Path,
    pg_cluster: Cluster,
    capsys: pytest.CaptureFixture[str],
) -> None:
    emulator.default = lambda req: Reply(text="noted")
    rig = TelegramRig(fake, emulator, home)
    await asyncio.to_thread(
        cli,
        home,
        capsys,
        "memory",
        "add",
        "--target",
        "user",
        "--user",
        f"telegram:{USER}",
        "Ada keeps a marzipanotter.",
    )
    await turn(rig, "before the move: heronbefore")

    url = pg_cluster.fresh_database()
    await asyncio.to_thread(cli, home, capsys, "migrate", "--to", url)
    (home / "config.yaml").write_text(f"database:\n  url: {url}\n", encoding="utf-8")
    await turn(rig, "after the move: zanzibarquokka")
    await asyncio.to_thread(
        cli,
        home,
        capsys,
        "memory",
        "add",
        "--target",
        "user",
        "--user",
        f"telegram:{USER}",
        "Ada moved to Porto.",
    )
    out = await asyncio.to_thread(cli, home, capsys, "backup", "now")
    assert "from postgresql" in out
    [archive] = (home / "backups").glob("mnemo-backup-*.tar.gz")
    with tarfile.open(archive) as tar:
        blob = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())  # type: ignore[union-attr]  # extractfile is None only for non-files
        manifest = json.loads(tar.extractfile("mnemo-export.json").read())  # type: ignore[union-attr]  # a file
    assert manifest["source"]["backend"] == "postgresql"
    assert b"after the move: zanzibarquokka" in blob and b"heronbefore" in blob
    assert b"Ada moved to Porto." in blob, "the profile as PostgreSQL keeps it"

    fresh = tmp_path / "fresh"
    await asyncio.to_thread(cli, fresh, capsys, "import", str(archive))
    assert (fresh / "state.db").is_file() and not (fresh / "config.yaml").read_text().count("database")
    found = await asyncio.to_thread(cli, fresh, capsys, "sessions", "search", "zanzibarquokka")
    assert "after the move: zanzibarquokka" in found

    moved = TelegramRig(fake, emulator, fresh)
    await turn(moved, "what did I tell you after the move?")
    same_session = emulator.requests[-1].body
    assert "marzipanotter" in json.dumps(same_session["system"]), "the frozen prompt came along"
    assert "after the move: zanzibarquokka" in json.dumps(same_session["messages"])
    await turn(moved, "/new")
    await turn(moved, "where do I live?")
    new_session = emulator.requests[-1].body
    assert "Ada moved to Porto." in json.dumps(new_session["system"]), "the profile restored from PostgreSQL"
