"""Throughput and latency of 1, 2 and 3 ``mnemo run`` replicas on one PostgreSQL, with
SQLite and one process as the reference. Prints figures; asserts nothing.

    python bench/replicas.py [--chats 50] [--messages 10] [--llm-delay 0.05] [--url postgresql://…]

Each run: real ``mnemo run`` processes (one configuration, one home) in Telegram webhook
mode behind a round-robin proxy (the one of ``tests/gateway/test_pg_replicas_e2e.py``),
the fake Telegram Bot API and the Anthropic emulator (every answer after ``--llm-delay``
seconds) in this process. All chats × messages are queued at once; the fake posts them
to the webhook one after another, as Telegram does. Reported: messages/s (first update
queued to last reply sent), latency p50/p99 (update queued → its reply stored by the
fake), and the CPU seconds of each replica and of the PostgreSQL server over the run, so
the scaling on this machine's cores can be read. PostgreSQL is a throw-away cluster
(``tests/support/pgcluster.py``) unless ``--url`` names a database (then emptied first).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import yaml

from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply
from tests.fakes.telegram_api import FakeTelegram
from tests.gateway.test_pg_replicas_e2e import QUESTION, RoundRobin, _free_port, _question
from tests.support.pgcluster import running_cluster

MNEMO = [sys.executable, "-m", "mnemo"]
SECRET = "bench-replicas-secret"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def children_cpu_s(parent: int) -> float:
    total = cpu_s(parent)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def one_run(
    label: str, replicas: int, url: str | None, postmaster: int | None, args: argparse.Namespace
) -> None:
    home = Path(tempfile.mkdtemp(prefix="mnemo-bench-replicas-"))
    (home / "config.yaml").write_text(yaml.safe_dump({
        "access": {"allowed": ["telegram:*"], "rate_limit_per_minute": 0},
        "web": {"enabled": False, "admin_token": "bench-admin"},
        "gateway": {"debounce_s": 0},
    }))  # fmt: skip
    if url is not None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")

    async def responder(rec: RecordedRequest) -> Reply:
        asked = _question(rec)
        await asyncio.sleep(args.llm_delay)
        return Reply(text="ok" if asked is None else f"re: chat {asked[0]} message {asked[1]}")

    ports = [_free_port() for _ in range(replicas)]
    procs: list[asyncio.subprocess.Process] = []
    async with FakeTelegram() as fake, Emulator(responder=responder) as emulator:
        proxy = RoundRobin(ports)
        await proxy.start()
        try:
            for port in ports:
                env = {
                    k: v
                    for k, v in os.environ.items()
                    if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
                }
                env.update(
                    MNEMO_HOME=str(home), MNEMO_WEB_PORT=str(port), MNEMO_LOG_LEVEL="warning",
                    TELEGRAM_BOT_TOKEN=fake.token, TELEGRAM_API_BASE_URL=fake.root,
                    TELEGRAM_WEBHOOK_URL=f"http://127.0.0.1:{proxy.port}/tg", TELEGRAM_WEBHOOK_SECRET=SECRET,
                    ANTHROPIC_BASE_URL=emulator.base_url, ANTHROPIC_API_KEY="bench-key",
                    **({"MNEMO_DATABASE_URL": url} if url is not None else {}),
                )  # fmt: skip
                procs.append(await asyncio.create_subprocess_exec(
                    *MNEMO, "run", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    env=env,
                ))  # fmt: skip
            await ready(ports)
            before = [cpu_s(p.pid) for p in procs]
            db_before = children_cpu_s(postmaster) if postmaster is not None else 0.0
            queued: dict[tuple[int, int], float] = {}
            start = time.monotonic()
            for k in range(args.messages):
                for c in range(args.chats):
                    fake.push_text(20_000 + c, 20_000 + c, f"chat {c} message {k}")
                    queued[(c, k)] = time.monotonic()
            total = args.chats * args.messages
            done: dict[tuple[int, int], float] = {}
            while len(done) < total:
                for sent in fake.sent:
                    m = QUESTION.search(sent.plain_text)
                    if m is not None:
                        done.setdefault((int(m.group(1)), int(m.group(2))), sent.at)
                await asyncio.sleep(0.05)
            elapsed = max(done.values()) - start
            cpu = [cpu_s(p.pid) - b for p, b in zip(procs, before, strict=True)]
            db_cpu = children_cpu_s(postmaster) - db_before if postmaster is not None else None
        finally:
            for p in procs:
                if p.returncode is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                await p.wait()
            await proxy.stop()
    shutil.rmtree(home, ignore_errors=True)
    latencies = [done[key] - queued[key] for key in queued]
    cpus = " ".join(f"{c:.1f}" for c in cpu)
    db = f", PostgreSQL {db_cpu:.1f} s" if db_cpu is not None else ""
    print(
        f"{label:<14} {total / elapsed:7.1f} msg/s   p50 {pct(latencies, 50) * 1000:7.0f} ms   "
        f"p99 {pct(latencies, 99) * 1000:7.0f} ms   CPU s per replica: {cpus}{db}   (wall {elapsed:.1f} s)"
    )


async def ready(ports: list[int]) -> None:
    async with aiohttp.ClientSession() as http, asyncio.timeout(180):
        for port in ports:
            while True:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.3)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--llm-delay", type=float, default=0.05)
    parser.add_argument("--url", help="a PostgreSQL database to use (emptied first)")
    args = parser.parse_args()
    print(
        f"{args.chats} chats x {args.messages} messages, LLM answers after {args.llm_delay * 1000:.0f} ms, "
        f"{os.cpu_count()} cores"
    )
    await one_run("SQLite, 1", 1, None, None, args)
    cluster_cm: Any = nullcontext(None) if args.url else running_cluster()
    with cluster_cm as cluster:
        postmaster = None
        if cluster is not None:
            postmaster = int((cluster.data / "postmaster.pid").read_text().splitlines()[0])
        for n in (1, 2, 3):
            url = args.url or cluster.fresh_database()
            await one_run(f"PostgreSQL, {n}", n, url, postmaster, args)


if __name__ == "__main__":
    asyncio.run(main())
