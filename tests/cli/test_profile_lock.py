"""One serving process per profile: ``mnemo run`` / ``chat`` / ``demo`` hold an flock on
``$MNEMO_HOME/.mnemo.lock``; a second one exits 1 naming the holder's PID, the commands
meant to work beside a gateway keep working, ``kill -9`` leaves no stale lock, and
``mnemo cron run-now`` never takes over a live gateway's rows."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import sys
from pathlib import Path

import pytest
import yaml

from mnemo.cli.main import main
from mnemo.gateway.cron.store import RunState
from mnemo.gateway.emulator import Reply
from mnemo.profile_lock import LOCK_NAME, ProfileInUse, hold, try_hold
from tests.gateway.test_cli_run import REPO, clean_env, read_until, start

TIMEOUT = 60.0
RUNNING = re.compile(r"mnemo is running")


async def mnemo(home: Path, env: dict[str, str], *argv: str, stdin: bytes = b"") -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mnemo", "--home", str(home), *argv,
        env=env, cwd=REPO, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), TIMEOUT)
    assert proc.returncode is not None
    return proc.returncode, out.decode() + err.decode()


@pytest.mark.slow
async def test_a_second_run_or_chat_on_a_busy_profile_exits_1_and_kill_9_leaves_no_stale_lock(
    home: Path, tmp_path: Path
) -> None:
    env = clean_env(tmp_path, MNEMO_WEB_PORT="0")
    first = await start(home, env)
    seen: list[str] = []
    try:
        await asyncio.wait_for(read_until(first.stderr, RUNNING, seen), TIMEOUT)
        lock = home / LOCK_NAME
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600
        assert lock.read_text().strip() == str(first.pid)

        for argv in (("run",), ("chat", "--user", "ada")):
            code, output = await mnemo(home, env, *argv, stdin=b"hello\n")
            assert code == 1, output
            assert f"this profile is in use by PID {first.pid}" in output
        code, output = await mnemo(home, env, "cron", "list")
        assert code == 0, output  # the commands meant to work beside a gateway still do

        first.kill()  # SIGKILL: no clean-up runs; the kernel drops the flock
        await first.wait()
        second = await start(home, env)
        try:
            await asyncio.wait_for(read_until(second.stderr, RUNNING, seen), TIMEOUT)
            assert lock.read_text().strip() == str(second.pid)
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), TIMEOUT) == 0
        finally:
            if second.returncode is None:
                second.kill()
                await second.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()


def test_the_lock_is_exclusive_within_one_process_too_and_released_on_exit(home: Path) -> None:
    with hold(home):
        with pytest.raises(ProfileInUse, match=f"in use by PID {os.getpid()}") as caught, hold(home):
            pass
        assert caught.value.code == 1
        with try_hold(home) as alone:
            assert alone is False
    with try_hold(home) as alone:
        assert alone is True


def test_the_lock_file_is_private_whatever_the_umask(home: Path) -> None:
    old = os.umask(0o022)
    try:
        with hold(home / "fresh"):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((home / "fresh").stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "fresh" / LOCK_NAME).stat().st_mode) == 0o600


async def test_cron_run_now_leaves_the_run_to_the_process_holding_the_profile(
    home: Path, emulator, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile whose gateway holds the lock (here: this test) but has not taken the run:
    run-now must not open its own app — that app's start would re-run the gateway's
    unfinished inbox rows and in-flight outbox rows."""
    (home / "config.yaml").write_text(yaml.safe_dump({"cron": {"poll_s": 0.1}}))
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", emulator.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    emulator.default = lambda rec: Reply(text="should not run here")
    cron = ["--home", str(home), "cron"]
    assert (
        await asyncio.to_thread(main, [*cron, "add", "--chat", "web:u1", "--every", "1d", "Daily", "digest"])
        == 0
    )
    capsys.readouterr()
    assert await asyncio.to_thread(main, [*cron, "list", "--json"]) == 0
    job_id = yaml.safe_load(capsys.readouterr().out.splitlines()[0])["id"]

    with hold(home):
        code = await asyncio.to_thread(main, [*cron, "run-now", job_id, "--wait", "0.5"])
    out = capsys.readouterr()
    assert "running it in this process" not in out.err
    assert emulator.requests == []
    assert code == 0 and "still running" in out.out

    from mnemo.gateway.cron.store import CronStore
    from mnemo.gateway.delivery.outbox import Outbox
    from mnemo.gateway.storage import state_database

    db = state_database(home / "state.db")
    await db.open()
    try:
        [run] = await CronStore(db, Outbox(db)).runs(job_id)
    finally:
        await db.close()
    assert run.state is RunState.REQUESTED and run.pid is None, "left for the gateway to take"
