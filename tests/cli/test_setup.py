"""``mnemo setup`` from a fresh home against local fakes of the model and Telegram (and
Discord): the flags for scripts, re-running it, a refused token, and the wizard in a
pseudo-terminal. Done when: the profile it writes passes ``mnemo doctor`` and ``mnemo
run`` answers a Telegram DM on it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from mnemo.gateway.emulator import Emulator, Reply
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.telegram_api import FakeTelegram
from tests.gateway.test_cli_run import clean_env, read_until
from tests.support.pty_session import PtySession

REPO = Path(__file__).resolve().parents[2]
MNEMO = [sys.executable, "-m", "mnemo"]
OWNER = 4242  # the operator's own Telegram account


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(bot_username="tea_bot", bot_name="Tea Bot") as fake:
        yield fake


def env_for(tmp_path: Path) -> dict[str, str]:
    # The web port is picked at start: other tests may hold mnemo's default one.
    return clean_env(tmp_path, MNEMO_WEB_PORT="0", MNEMO_LOG_LEVEL="warning")


async def mnemo(home: Path, env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *MNEMO, "--home", str(home), *argv,
        env=env, cwd=REPO, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def flags(emulator: Emulator, telegram: FakeTelegram) -> list[str]:
    return [
        "--anthropic-key", "sk-ant-test-0000000000000000",
        "--anthropic-base-url", emulator.base_url,
        "--telegram-token", telegram.token,
        "--telegram-api-base-url", telegram.root,
    ]  # fmt: skip


async def test_non_interactive_setup_gives_a_profile_doctor_passes_and_run_answers_a_dm(
    tmp_path: Path, emulator: Emulator, telegram: FakeTelegram
) -> None:
    home, env = tmp_path / "fresh", env_for(tmp_path)
    code, out, err = await mnemo(
        home, env, "setup", "--non-interactive", *flags(emulator, telegram),
        "--allow-user", f"telegram:{OWNER}", "--json",
    )  # fmt: skip
    assert code == 0, out + err
    report = json.loads(out)
    assert report["ok"] and report["checks"]["telegram"]["detail"].startswith("@tea_bot")
    assert {c["name"]: c["status"] for c in report["doctor"]} == {
        "config": "pass", "home": "pass", ".env": "pass", "memories": "pass", "llm": "pass",
        "telegram": "pass", "web": "pass", "state.db": "pass", "search index": "pass",
    }  # fmt: skip
    assert telegram.token not in out and "sk-ant-test" not in out, "secrets never printed"
    assert stat.S_IMODE((home / ".env").stat().st_mode) == 0o600
    config = yaml.safe_load((home / "config.yaml").read_text())
    assert config["access"]["allowed"] == [f"telegram:{OWNER}"]
    assert config["telegram"]["api_base_url"] == telegram.root
    assert telegram.token not in (home / "config.yaml").read_text(), "secrets live in .env only"

    code, out, _ = await mnemo(home, env, "doctor")
    assert code == 0 and out.strip().endswith("all checks passed"), out

    emulator.script(Reply(text="Hello from mnemo!"))
    proc = await asyncio.create_subprocess_exec(
        *MNEMO, "--home", str(home), "run", env=env, cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        await asyncio.wait_for(read_until(proc.stderr, __import__("re").compile("mnemo is running"), []), 60)
        telegram.push_text(chat_id=OWNER, user_id=OWNER, text="hi bot", first_name="Ada")
        [reply] = await telegram.wait_for_sent(1, timeout=60)
        assert reply.chat_id == OWNER and "Hello from mnemo!" in reply.text
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_running_setup_again_edits_and_never_clobbers(
    tmp_path: Path, emulator: Emulator, telegram: FakeTelegram
) -> None:
    home, env = tmp_path / "home", env_for(tmp_path)
    home.mkdir(mode=0o700)
    (home / "config.yaml").write_text("gateway:\n  timezone: Europe/Lisbon\n")
    (home / ".env").write_text("# my notes\nHONCHO_API_KEY=keep-me\n")
    code, out, err = await mnemo(home, env, "setup", "--non-interactive", *flags(emulator, telegram))
    assert code == 0, out + err
    code, out, err = await mnemo(
        home, env, "setup", "--non-interactive", "--allow-user", "telegram:7,discord:9"
    )
    assert code == 0, out + err
    config = yaml.safe_load((home / "config.yaml").read_text())
    assert config["gateway"]["timezone"] == "Europe/Lisbon"
    assert config["llm"]["base_url"] == emulator.base_url
    assert config["access"]["allowed"] == ["telegram:7", "discord:9"]
    dotenv = (home / ".env").read_text()
    assert dotenv.startswith("# my notes\nHONCHO_API_KEY=keep-me\n")
    assert f"TELEGRAM_BOT_TOKEN={telegram.token}" in dotenv and "ANTHROPIC_API_KEY=" in dotenv
    assert (home / "config.yaml.bak").is_file()
    code, out, _ = await mnemo(home, env, "setup", "--non-interactive", "--allow-user", "telegram:7")
    assert code == 0 and "nothing (every value was already set)" in out


async def test_a_refused_token_writes_nothing(
    tmp_path: Path, emulator: Emulator, telegram: FakeTelegram
) -> None:
    home, env = tmp_path / "home", env_for(tmp_path)
    bad = [*flags(emulator, telegram)]
    bad[bad.index(telegram.token)] = "4242000001:" + "x" * 35
    code, out, err = await mnemo(home, env, "setup", "--non-interactive", *bad)
    assert code == 1 and "telegram: Telegram refused the token" in err and "nothing was saved" in err
    assert not (home / "config.yaml").exists() and not (home / ".env").exists()
    code, _, err = await mnemo(home, env, "setup", "--non-interactive", "--telegram-token", telegram.token,
                               "--telegram-api-base-url", telegram.root)  # fmt: skip
    assert code == 2 and "needs a model key" in err


async def test_discord_without_the_message_content_intent_is_refused_with_the_fix(
    tmp_path: Path, emulator: Emulator
) -> None:
    home, env = tmp_path / "home", env_for(tmp_path)
    async with FakeDiscord(privileged_intents=()) as discord:
        code, _, err = await mnemo(
            home, env, "setup", "--non-interactive", "--anthropic-key", "sk-test",
            "--anthropic-base-url", emulator.base_url,
            "--discord-token", discord.token, "--discord-api-base-url", discord.api_base,
        )  # fmt: skip
    assert code == 1 and "Message Content intent is off" in err and "Privileged Gateway Intents" in err
    assert not (home / ".env").exists()


async def test_the_wizard_in_a_terminal_pairs_the_owner_and_ends_with_doctor(
    tmp_path: Path, emulator: Emulator, telegram: FakeTelegram
) -> None:
    home = tmp_path / "home"
    env = {
        **env_for(tmp_path),
        "TERM": "xterm",
        "ANTHROPIC_BASE_URL": emulator.base_url,
        "TELEGRAM_API_BASE_URL": telegram.root,
    }
    term = PtySession.spawn([*MNEMO, "--home", str(home), "setup"], env=env, cwd=REPO)
    try:
        await term.expect(r"1/6 Model")
        await term.expect(r"API key .*\[none\]: ")
        term.send("sk-ant-test-0000000000000000")
        await term.expect(r"✓ .*answers")
        await term.expect(r"bot token from @BotFather .*: ")
        term.send(telegram.token)
        await term.expect(r"✓ @tea_bot \(Tea Bot\)")
        await term.expect(r"send @tea_bot a message from your own Telegram account now\? \[Y/n\]: ")
        term.send("")
        await term.expect(r"waiting up to")
        telegram.push_text(chat_id=OWNER, user_id=OWNER, text="/start", first_name="Ada")
        await term.expect(rf"Ada \(telegram:{OWNER}\) wrote: allow them and make them an admin\? \[Y/n\]: ")
        term.send("y")
        await term.expect(r"3/6 Discord")
        await term.expect(r"bot token .*: ")
        term.send("")
        await term.expect(r"add people.*: ")
        term.send("discord:555")
        await term.expect(r"provider \(none or a name above\) \[none\]: ")
        term.send("")
        await term.expect(r"database: .*: ")
        term.send("")
        await term.expect(r"daily verified backups .*\[Y/n\]: ")
        term.send("")
        await term.expect(r"all checks passed", timeout=60)
        assert await term.wait() == 0
    finally:
        term.kill()
    assert "sk-ant-test" not in term.output, "the key is never echoed"
    config = yaml.safe_load((home / "config.yaml").read_text())
    assert config["access"]["allowed"] == [f"telegram:{OWNER}", "discord:555"]
    assert config["access"]["admins"] == [f"telegram:{OWNER}"]
    assert "ANTHROPIC_API_KEY=sk-ant-test" in (home / ".env").read_text()
    assert stat.S_IMODE(os.stat(home / ".env").st_mode) == 0o600
    assert not telegram.pending_updates, "the owner's /start was read by setup, not left for the bot"


async def test_a_memory_provider_is_checked_stored_and_switched_on(
    tmp_path: Path, emulator: Emulator, telegram: FakeTelegram
) -> None:
    from tests.fakes.honcho_api import FakeHoncho

    home, env = tmp_path / "home", env_for(tmp_path)
    down = ["--provider", "honcho", "--set", "base_url=http://127.0.0.1:9", "--set", "api_key=hc-test"]
    code, _, err = await mnemo(home, env, "setup", "--non-interactive", *down)
    assert code == 1 and "honcho at http://127.0.0.1:9 is unreachable" in err
    assert not (home / "providers" / "honcho").exists() and not (home / "config.yaml").exists()
    code, _, err = await mnemo(
        home, env, "setup", "--non-interactive", "--provider", "honcho", "--set", "colour=red"
    )
    assert code == 2 and "unknown setting(s) colour" in err

    honcho = FakeHoncho()
    await honcho.start()
    try:
        code, out, err = await mnemo(
            home, env, "setup", "--non-interactive", *flags(emulator, telegram),
            "--provider", "honcho", "--set", f"base_url={honcho.base_url}", "--set", "api_key=hc-test", "--json",
        )  # fmt: skip
    finally:
        await honcho.stop()
    assert code == 0, out + err
    report = json.loads(out)
    assert report["checks"]["provider"]["ok"] and "hc-test" not in out
    assert yaml.safe_load((home / "config.yaml").read_text())["memory"]["provider"] == "honcho"
    assert (
        json.loads((home / "providers" / "honcho" / "config.json").read_text())["base_url"] == honcho.base_url
    )
    assert stat.S_IMODE((home / "providers" / "honcho" / "secrets.json").stat().st_mode) == 0o600


async def test_providers_setup_on_a_terminal_asks_to_activate(tmp_path: Path) -> None:
    home = tmp_path / "home"
    term = PtySession.spawn(
        [*MNEMO, "--home", str(home), "providers", "setup", "holographic"], env=env_for(tmp_path), cwd=REPO
    )
    try:
        for _ in range(8):  # every setting: Enter keeps the default
            found = await term.expect(r"\]: ")
            if "activate holographic now" in term.output[: found.end()].rsplit("\n", 1)[-1]:
                break
            term.send("")
        term.send("y")
        await term.expect("holographic is now the active memory provider")
        assert await term.wait() == 0
    finally:
        term.kill()
    assert yaml.safe_load((home / "config.yaml").read_text()) == {"memory": {"provider": "holographic"}}
