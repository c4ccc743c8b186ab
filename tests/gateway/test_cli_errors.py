"""Ordinary problems of a real machine get one clear line on stderr, never a traceback
(issue 12, items 10-14). Each case runs ``mnemo``'s entry point with its own home,
environment and standard streams (tests/support/cli.py); as a real process where the
process boundary is what is tested: a read-only mount namespace, pipes.

How the bad inputs are made, as root (the tests run as root, so ``chmod -w`` stops
nothing): a read-only home is a read-only bind mount of the home in a private mount
namespace (``unshare -m``), which gives the kernel's real EROFS; a port in use is held
by a listening socket; a damaged ``state.db`` is a real one with garbage written over
some of its pages; a broken pipe is ``| head -1`` in a shell.
"""

from __future__ import annotations

import io
import os
import socket
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from mnemo.cli.terminal import Spinner
from mnemo.gateway.config import load_settings
from mnemo.gateway.errors import StartupError
from mnemo.gateway.inbound.access import AccessControl
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.webserver import WebServer
from tests.support.cli import Result, run_mnemo

MNEMO = [sys.executable, "-m", "mnemo"]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
    }
    env.update({"MNEMO_HOME": str(home), "PYTHONIOENCODING": "utf-8", "MNEMO_WEB_PORT": "0", **extra})
    return env


def mnemo(home: Path, *args: str, stdin: str = "", **env: str) -> Result:
    return run_mnemo(home, *args, stdin=stdin, **{"MNEMO_WEB_PORT": "0", **env})


def one_clear_line(out: Result | subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert out.returncode == code, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("mnemo: ")]
    assert len(lines) == 1, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def fresh_profile(home: Path) -> Path:
    home.mkdir(mode=0o700, exist_ok=True)
    out = mnemo(home, "chat", "--user", "ann", stdin="hello there\n")
    assert out.returncode == 0, out.stderr
    assert (home / "state.db").is_file()
    return home


def damage(db: Path, *, every: int = 2, last: int | None = None) -> None:
    """Write garbage over every ``every``-th page after the first (header and schema
    page intact, so the file still opens), or over the ``last`` few pages only (the
    filler table's leaves: every query still works, quick_check finds them)."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("CREATE TABLE IF NOT EXISTS filler(x)")
    conn.executemany("INSERT INTO filler VALUES (?)", [("x" * 400,)] * 800)
    conn.commit()
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    pages = db.stat().st_size // page
    stop = 2 if last is None else pages - 1 - last
    with db.open("r+b") as f:
        for n in range(pages - 1, stop, -every):
            f.seek(n * page + 8)
            f.write(b"\xff" * 64)


# --- item 10: the boundary ----------------------------------------------------------------
def test_run_on_a_port_in_use_names_host_port_and_the_setting(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = mnemo(tmp_path / "home", "run", MNEMO_WEB_PORT=str(port))
    one_clear_line(out, 2, f"127.0.0.1:{port}", "already in use", "MNEMO_WEB_PORT")


async def test_the_web_server_bind_error_is_a_startup_error_and_leaves_nothing_open(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        settings = load_settings(tmp_path, environ={"MNEMO_WEB_PORT": str(port)})
        server = WebServer(settings.web, Metrics())
        with pytest.raises(StartupError, match=f"127.0.0.1:{port}.*MNEMO_WEB_PORT"):
            await server.start()
        await server.stop()  # idempotent after a failed start


def _read_only(home: Path, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``mnemo ARGV`` with ``home`` mounted read-only (a private mount namespace)."""
    script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" || exit 99; shift; exec "$@"'
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(home), *MNEMO, *argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=_env(home),
        timeout=120,
    )
    assert out.returncode != 99, f"cannot make a read-only bind mount here: {out.stderr}"
    return out


@pytest.mark.parametrize("with_db", [False, True], ids=["empty-home", "existing-state-db"])
@pytest.mark.parametrize(
    "argv",
    [("chat", "--user", "ann"), ("run",), ("cron", "add", "--chat", "telegram:1", "--every", "1h", "hi")],
    ids=["chat", "run", "cron-add"],
)
def test_a_read_only_home_is_one_line(tmp_path: Path, argv: tuple[str, ...], with_db: bool) -> None:
    home = fresh_profile(tmp_path / "home") if with_db else tmp_path / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    out = _read_only(home, *argv, stdin="hello\n")
    line = one_clear_line(out, 1, str(home))
    assert "read-only" in line or "writable" in line, line


def test_a_home_that_is_a_file_is_a_configuration_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("not a folder")
    for argv in (("doctor",), ("chat",), ("sessions", "list")):
        one_clear_line(mnemo(home, *argv), 2, "MNEMO_HOME", str(home), "is a file, not a folder")
    one_clear_line(mnemo(home / "below", "doctor"), 2, str(home), "is a file, not a folder")


@pytest.mark.parametrize(
    "argv", [("sessions", "list"), ("chat", "--user", "ann"), ("run",)], ids=["sessions-list", "chat", "run"]
)
def test_a_state_db_that_is_not_a_database_is_one_line(tmp_path: Path, argv: tuple[str, ...]) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "state.db").write_bytes(b"this is no database " * 400)
    one_clear_line(mnemo(home, *argv, stdin="hi\n"), 1, "damaged", "not a database", "mnemo doctor")


def test_a_malformed_state_db_is_one_line_and_verbose_shows_the_traceback(tmp_path: Path) -> None:
    home = fresh_profile(tmp_path / "home")
    damage(home / "state.db", every=1)
    one_clear_line(mnemo(home, "sessions", "search", "hello"), 1, "damaged")
    verbose = mnemo(home, "--verbose", "sessions", "search", "hello")
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr and "mnemo: " in verbose.stderr


def test_doctor_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    cmd = " ".join([*MNEMO, "doctor"]) + ' | head -1; echo "status=${PIPESTATUS[0]}" >&2'
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=_env(home), timeout=120)
    assert out.stdout.count("\n") == 1, out.stdout
    assert (
        "Traceback" not in out.stderr
        and "BrokenPipe" not in out.stderr
        and "Exception ignored" not in out.stderr
    )
    assert out.stderr.strip().endswith(("status=0", "status=1")), (
        out.stderr
    )  # 0 when head read before closing


@pytest.mark.parametrize("argv", [("doctor",), ("sessions", "list"), ("cron", "list"), ("memory", "show")])
def test_a_reader_gone_before_the_first_line_is_a_quiet_exit_1(tmp_path: Path, argv: tuple[str, ...]) -> None:
    home = fresh_profile(tmp_path / "home")
    assert mnemo(home, "cron", "add", "--chat", "telegram:1", "--every", "1h", "hi").returncode == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head -1` once head has gone: every write is EPIPE
    try:
        out = subprocess.run(
            [*MNEMO, *argv], stdout=write_end, stderr=subprocess.PIPE, text=True, env=_env(home), timeout=120
        )
    finally:
        os.close(write_end)
    assert out.returncode == 1, out.stderr
    assert out.stderr == "", out.stderr


# --- item 11: doctor tells the truth ------------------------------------------------------
def test_doctor_reports_damaged_pages_from_quick_check(tmp_path: Path) -> None:
    home = fresh_profile(tmp_path / "home")
    damage(home / "state.db", every=1, last=5)
    assert mnemo(home, "sessions", "list").returncode == 0  # it still opens: only quick_check sees it
    out = mnemo(home, "doctor")
    assert out.returncode == 1, out.stdout
    line = next(line for line in out.stdout.splitlines() if " state.db:" in line)
    assert line.startswith("✗") and "damaged" in line and "page" in line, line
    assert "***" not in line
    sound = fresh_profile(tmp_path / "sound")
    ok = next(line for line in mnemo(sound, "doctor").stdout.splitlines() if " state.db:" in line)
    assert ok.startswith("✓") and "quick_check" in ok, ok


def test_every_bad_cron_job_is_reported_at_once_by_doctor_and_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.yaml").write_text(
        "cron:\n  jobs:\n"
        "    - {id: fine, chat: 'telegram:1', prompt: hi, cron: '0 8 * * *'}\n"
        "    - {id: minute99, chat: 'telegram:1', prompt: hi, cron: '99 8 * * *'}\n"
        "    - {id: nochat, chat: 'nowhere', prompt: hi, every: 1h}\n"
        "    - {id: tooquick, chat: 'telegram:1', prompt: hi, every: 5s}\n"
        "    - {id: fine, chat: 'telegram:1', prompt: again, every: 1h}\n"
        "    - {id: mars, chat: 'telegram:1', prompt: hi, at: '2030-01-01T08:00', timezone: Mars/Olympus}\n"
        "    - {id: done, chat: 'telegram:1', prompt: hi, at: '2020-01-01T08:00'}\n"
    )
    for argv in (("doctor",), ("run",)):
        out = mnemo(home, *argv)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        for expected in (
            "cron.jobs[1] (minute99)",
            "cron.jobs[2] (nochat)",
            "cron.jobs[3] (tooquick)",
            "cron.jobs[4]: id 'fine' is used twice",
            "cron.jobs[5] (mars)",
        ):
            assert expected in out.stderr, (argv, out.stderr)
        assert "(fine):" not in out.stderr and "(done)" not in out.stderr  # a past 'at' may have run


# --- item 12: backups ---------------------------------------------------------------------
def test_export_refuses_a_folder_an_existing_file_and_a_missing_parent(tmp_path: Path) -> None:
    home = fresh_profile(tmp_path / "home")
    one_clear_line(mnemo(home, "export", str(tmp_path)), 1, "is a folder")
    existing = tmp_path / "old.tar.gz"
    existing.write_bytes(b"keep me")
    one_clear_line(mnemo(home, "export", str(existing)), 1, "already exists", "--force")
    assert existing.read_bytes() == b"keep me"
    assert mnemo(home, "export", "--force", str(existing)).returncode == 0
    assert tarfile.is_tarfile(existing)
    missing = tmp_path / "no" / "such" / "backup.tar.gz"
    one_clear_line(mnemo(home, "export", str(missing)), 1, "does not exist")
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("how", ["garbage", "damaged", "foreign"])
def test_export_refuses_a_bad_state_db_and_writes_nothing(tmp_path: Path, how: str) -> None:
    home = fresh_profile(tmp_path / "home")
    db = home / "state.db"
    if how == "garbage":
        db.write_bytes(b"\0" * 100_000)
    elif how == "damaged":
        damage(db)
    else:
        for side in ("state.db-wal", "state.db-shm"):
            (home / side).unlink(missing_ok=True)
        db.unlink()
        sqlite3.connect(db).execute("CREATE TABLE other(x)").connection.commit()
    dest = tmp_path / "out"
    dest.mkdir()
    out = mnemo(home, "export", str(dest / "backup.tar.gz"))
    one_clear_line(out, 1, "state.db")
    assert list(dest.iterdir()) == []


def _archive(path: Path, members: dict[str, bytes], manifest: bool = True) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        items = dict(members)
        if manifest:
            items = {"mnemo-export.json": b'{"format": "mnemo-profile", "version": 1, "files": []}', **items}
        for name, data in items.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _sound_state_db(tmp_path: Path) -> bytes:
    """A sound state.db as 0.1's export archived it (format version 1)."""
    home = fresh_profile(tmp_path / "source")
    copy = tmp_path / "sound.db"
    source, target = sqlite3.connect(home / "state.db"), sqlite3.connect(copy)
    source.backup(target)
    target.execute("PRAGMA journal_mode=DELETE")
    source.close()
    target.close()
    return copy.read_bytes()


@pytest.mark.parametrize(
    "case",
    [
        "zero-filled-db",
        "damaged-db",
        "foreign-db",
        "provider-db-garbage",
        "control-char-folder",
        "unknown-memories-file",
        "deep-user-file",
    ],
)
def test_import_refuses_bad_content_and_writes_nothing(tmp_path: Path, case: str) -> None:
    sound = _sound_state_db(tmp_path)
    if case == "damaged-db":
        scratch = tmp_path / "scratch.db"
        scratch.write_bytes(sound)
        damage(scratch)
        members = {"state.db": scratch.read_bytes()}
    elif case == "foreign-db":
        scratch = tmp_path / "foreign.db"
        sqlite3.connect(scratch).execute("CREATE TABLE other(x)").connection.commit()
        members = {"state.db": scratch.read_bytes()}
    else:
        members = {
            "zero-filled-db": {"state.db": b"\0" * 30_000_000},
            "provider-db-garbage": {"state.db": sound, "providers/holographic/memory.db": b"\0" * 4096},
            "control-char-folder": {"state.db": sound, "skills/bad\x1b[2Jname/SKILL.md": b"x"},
            "unknown-memories-file": {"state.db": sound, "memories/notes.txt": b"x"},
            "deep-user-file": {"state.db": sound, "memories/users/telegram/1/extra/USER.md": b"x"},
        }[case]
    archive = _archive(tmp_path / "in.tar.gz", members)
    home = tmp_path / "target"
    out = mnemo(home, "import", str(archive))
    one_clear_line(out, 1, "refused")
    assert not home.exists(), sorted(home.rglob("*"))


def test_import_refuses_a_bomb_at_its_header_before_reading_data(tmp_path: Path) -> None:
    info = tarfile.TarInfo("state.db")
    info.size = 50 * 1024**3  # declared; the data that would follow is never there
    archive = tmp_path / "bomb.tar.gz"
    import gzip

    archive.write_bytes(gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT) + b"\0" * 1024))
    one_clear_line(mnemo(tmp_path / "target", "import", str(archive)), 1, "refused", "at most")
    assert not (tmp_path / "target").exists()


def test_a_sound_export_still_imports(tmp_path: Path) -> None:
    home = fresh_profile(tmp_path / "home")
    archive = tmp_path / "backup.tar.gz"
    assert mnemo(home, "export", str(archive)).returncode == 0
    target = tmp_path / "target"
    out = mnemo(target, "import", str(archive))
    assert out.returncode == 0, out.stderr
    assert mnemo(target, "sessions", "list").returncode == 0


# --- item 13: logs stay out of the conversation ------------------------------------------
def test_interactive_commands_log_warnings_only_and_the_banner_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    chat = mnemo(home, "chat", "--user", "ann", stdin="hello\n")
    assert chat.returncode == 0, chat.stderr
    assert chat.stderr.count("LOCAL TRIAL MODE") == 1, chat.stderr
    assert '"level": "info"' not in chat.stderr and "[info" not in chat.stderr, chat.stderr
    assert mnemo(home, "cron", "add", "--chat", "telegram:1", "--every", "1h", "hi").returncode == 0
    for argv in (("cron", "list"), ("memory", "show"), ("sessions", "list")):
        out = mnemo(home, *argv)
        assert out.returncode == 0 and out.stderr == "", (argv, out.stderr)
    verbose = mnemo(home, "chat", "--user", "ann", "--verbose", stdin="hello\n")
    assert '"level": "info"' in verbose.stderr, verbose.stderr


def test_access_policy_lines_name_configured_platforms_only(tmp_path: Path) -> None:
    settings = load_settings(tmp_path, environ={"TELEGRAM_BOT_TOKEN": "123456:" + "A" * 35})
    lines = AccessControl(settings, pairings=None).describe()  # type: ignore[arg-type]  # describe() never reads the pairings
    assert [line.split(":")[0] for line in lines] == ["telegram"]
    assert AccessControl(load_settings(tmp_path, environ={}), pairings=None).describe() == []  # type: ignore[arg-type]  # describe() never reads the pairings


# --- item 14: signs of life ---------------------------------------------------------------
class FakeTerminal(io.StringIO):
    encoding = "utf-8"

    def isatty(self) -> bool:
        return True


def test_the_spinner_draws_on_a_terminal_and_erases_its_line() -> None:
    tty = FakeTerminal()
    with Spinner("checking", tty):
        deadline = time.monotonic() + 10
        while "checking" not in tty.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    text = tty.getvalue()
    assert "checking…" in text and text.endswith("\r\x1b[K")
    piped = io.StringIO()
    with Spinner("checking", piped):
        time.sleep(0.05)
    assert piped.getvalue() == ""


def test_doctor_gives_each_probe_one_deadline_and_no_spinner_off_a_terminal(tmp_path: Path) -> None:
    # Endpoints that accept and never answer: each check fails with the one deadline.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        home = tmp_path / "home"
        home.mkdir(mode=0o700)
        out = mnemo(
            home,
            "doctor",
            "--timeout",
            "1",
            ANTHROPIC_BASE_URL=url,
            TELEGRAM_BOT_TOKEN="123456:" + "A" * 35,
            TELEGRAM_API_BASE_URL=url,
        )
    assert out.returncode == 1
    assert "✗ llm: unreachable: no answer within 1 s" in out.stdout
    assert "✗ telegram: unreachable: no answer within 1 s" in out.stdout
    assert "…" not in out.stderr  # stderr is not a terminal: no spinner
