"""Footprint of one idle ``mnemo run``: resident memory, and the time from exec to ready.
Prints figures; asserts nothing.

    python bench/footprint.py [--backend sqlite|postgresql|both] [--runs 3] [--idle-s 5]
    python bench/footprint.py --chats 1000 [--concurrency 50] [--backend ...]

Each run starts ``python -m mnemo run`` as a real process on a fresh profile (the web
chat on a free 127.0.0.1 port, no platform token, no API key: the local trial mode, so
nothing leaves the machine), polls ``/healthz`` until it answers 200 — "ready" — then
lets it idle for ``--idle-s`` seconds and reads its resident set (``VmRSS``) and peak
(``VmHWM``) from ``/proc``, and stops it with SIGTERM. It is then started a second time
on the same profile (a restart: the schema is already there). PostgreSQL runs use a
throw-away cluster (``tests/support/pgcluster.py``), a fresh database per run.

``--chats N``: once ready, N web-chat users (N websockets, one DM chat each) each send
a message and wait for the trial model's reply, ``--concurrency`` at a time, and every
socket stays open; after the last reply and ``--idle-s`` seconds the resident set is
read — the footprint with N chats active (sessions, prompt caches, per-chat lanes and
sockets all live). Only the first start is measured in this mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


async def drive_chats(port: int, chats: int, concurrency: int) -> tuple[float, list[object]]:
    """N web-chat users, each one message answered; (seconds, the open sockets)."""
    import aiohttp

    # limit=0: every socket stays open, so the default pool of 100 connections would stall chat 101.
    http = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
    )
    sockets: list[object] = []
    gate = asyncio.Semaphore(concurrency)

    async def chat(i: int) -> None:
        async with gate:
            ws = await http.ws_connect(
                f"http://127.0.0.1:{port}/ws", params={"user": f"bench-user-{i:06d}"}, heartbeat=None
            )
            sockets.append(ws)
            await ws.send_str(json.dumps({"type": "message", "id": f"m{i}", "text": f"hello, I am user {i}"}))
            while True:
                msg = await asyncio.wait_for(ws.receive(), 120)
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    raise RuntimeError(f"chat {i}: socket ended ({msg.type.name}) before the reply")
                frame = json.loads(msg.data)
                if frame["type"] == "reply":
                    return
                if frame["type"] == "error":
                    raise RuntimeError(f"chat {i}: {frame}")

    t0 = time.perf_counter()
    await asyncio.gather(*(chat(i) for i in range(chats)))
    elapsed = time.perf_counter() - t0
    sockets.append(http)
    return elapsed, sockets


async def close_all(sockets: list[object]) -> None:
    for s in sockets:
        await s.close()  # type: ignore[attr-defined]  # each socket is an aiohttp or httpx client; both have close()


def one_start(
    home: Path, url: str | None, idle_s: float, chats: int = 0, concurrency: int = 50
) -> tuple[float, float, float]:
    """(seconds to ready, RSS MiB after idling, peak RSS MiB)."""
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
    }
    env.update(MNEMO_HOME=str(home), MNEMO_WEB_PORT=str(port), MNEMO_LOG_LEVEL="warning")
    if url is not None:
        env["MNEMO_DATABASE_URL"] = url
    # The log goes to a file: a pipe nobody reads fills up under load and stalls the bot.
    log = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnemo", "run"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"mnemo run exited {proc.returncode}: {log.read().decode()[-400:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet
            if time.perf_counter() - t0 > 60:
                raise RuntimeError("mnemo run was not ready within 60 s")
            time.sleep(0.01)
        ready = time.perf_counter() - t0
        if chats:
            loop = asyncio.new_event_loop()
            idle_rss = proc_kib(proc.pid, "VmRSS") / 1024
            elapsed, sockets = loop.run_until_complete(drive_chats(port, chats, concurrency))
            time.sleep(idle_s)
            rss, peak = proc_kib(proc.pid, "VmRSS") / 1024, proc_kib(proc.pid, "VmHWM") / 1024
            print(
                f"  {chats} chats answered in {elapsed:.1f} s ({chats / elapsed:.0f}/s); RSS {idle_rss:.0f} MiB "
                f"before, {rss:.0f} MiB with all {chats} active (sockets open), peak {peak:.0f} MiB",
                flush=True,
            )
            loop.run_until_complete(close_all(sockets))
            loop.close()
        else:
            time.sleep(idle_s)
            rss, peak = proc_kib(proc.pid, "VmRSS") / 1024, proc_kib(proc.pid, "VmHWM") / 1024
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if chats:
            log.seek(0)
            lines = log.read().decode(errors="replace").splitlines()
            if lines:
                print(
                    f"  the bot logged {len(lines)} warning/error lines, the last: {lines[-1][:300]}",
                    flush=True,
                )
        log.close()
    return ready, rss, peak


def run_chats(backend: str, runs: int, idle_s: float, chats: int, concurrency: int) -> None:
    if backend == "postgresql":
        from tests.support.pgcluster import running_cluster

        cluster_cm = running_cluster()
    else:
        cluster_cm = nullcontext(None)
    rss, peak = [], []
    with cluster_cm as cluster:
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix="mnemo-footprint-") as tmp:
                home = Path(tmp) / "home"
                home.mkdir(mode=0o700)
                url = cluster.fresh_database() if cluster is not None else None
                _, m, p = one_start(home, url, idle_s, chats, concurrency)
                rss.append(m)
                peak.append(p)
    med = statistics.median
    print(
        f"{backend:>10}: RSS with {chats} active chats {med(rss):.0f} MiB (min {min(rss):.0f}, max {max(rss):.0f}), "
        f"peak {med(peak):.0f} MiB — median of {runs} runs",
        flush=True,
    )


def run(backend: str, runs: int, idle_s: float) -> None:
    if backend == "postgresql":
        from tests.support.pgcluster import running_cluster

        cluster_cm = running_cluster()
    else:
        cluster_cm = nullcontext(None)
    first, again, rss, peak = [], [], [], []
    with cluster_cm as cluster:
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix="mnemo-footprint-") as tmp:
                home = Path(tmp) / "home"
                home.mkdir(mode=0o700)
                url = cluster.fresh_database() if cluster is not None else None
                r1, m1, p1 = one_start(home, url, idle_s)
                r2, m2, p2 = one_start(home, url, idle_s)
                first.append(r1)
                again.append(r2)
                rss += [m1, m2]
                peak += [p1, p2]
    med = statistics.median
    print(
        f"{backend:>10}: ready in {med(first):.2f} s (fresh profile), {med(again):.2f} s (restart); "
        f"idle RSS {med(rss):.0f} MiB (min {min(rss):.0f}, max {max(rss):.0f}), peak {med(peak):.0f} MiB "
        f"— median of {runs} runs",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument(
        "--chats", type=int, default=0, help="drive this many web chats, then measure (0: idle only)"
    )
    ap.add_argument("--concurrency", type=int, default=50, help="--chats: conversations in flight at once")
    args = ap.parse_args()
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        if args.chats > 0:
            run_chats(backend, args.runs, args.idle_s, args.chats, args.concurrency)
        else:
            run(backend, args.runs, args.idle_s)


if __name__ == "__main__":
    main()
