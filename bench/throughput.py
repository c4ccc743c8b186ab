"""Throughput under load, side by side with a minimal python-telegram-bot + anthropic bot.

    python bench/throughput.py [--chats 200] [--messages 5] [--burst 1000] [--runs 3]
                               [--db-trips] [--pg]

A fake Telegram Bot API (``tests/fakes/telegram_api.py``) and a fake Anthropic API (the
emulator, answering ``ack c<chat> m<n>`` at once) run in this process with ~0 ms latency.
Two bots run against them, one after the other in the same run, each as a subprocess so
that its CPU time can be read from ``/proc/<pid>/stat``:

(a) the **anchor**: a minimal bot written below (``anchor_bot``): python-telegram-bot's
    ``Application`` polling, ``AsyncAnthropic.messages.create`` with the user's text,
    ``reply_text`` with the answer. Nothing else: no storage, no memory, no typing.
(b) ``mnemo run`` on a fresh profile with its defaults, except ``gateway.debounce_s: 0``
    (the deliberate wait for a burst of one person's messages would otherwise be
    measured) and telegram:* allowed.

Two loads per bot:

* ``--chats`` conversations at once: each chat sends ``--messages`` messages, the next
  one when the answer to the previous has arrived;
* a burst: ``--burst`` chats (new ones) each send one message at the same moment.

For each: replies/s, CPU ms per reply (the bot process's user + system time over the
load, divided by the replies), update → reply latency p50/p95 (the fake's push → the
fake receiving the ``sendMessage`` with the answer), typing requests per reply; for the
burst also the time until the first 100 replies and the lowest replies/s over any 1-s
window after the first 5 s (while replies were still due). Each figure is printed for
both bots and as mnemo/anchor. ``--runs`` repeats the whole run and prints the median of
each ratio. The targets (issue 30) are checked on the medians:

* CPU ms per reply at ``--chats`` conversations ≤ 1.5× the anchor's;
* first 100 replies of the burst ≤ 2× the anchor's time;
* lowest replies/s after the first 5 s of the burst ≥ 0.5× the anchor's mean rate.

``--db-trips`` also counts database round trips per plain message (the Database's
``on_round_trip`` hook) on SQLite and, with ``--pg``, on a throw-away PostgreSQL cluster.

The machine's load (``os.getloadavg``) is printed with the figures: on a shared machine
the ratios are what count, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram  # noqa: E402

MODEL = "claude-sonnet-4-6"
_KEY = re.compile(r"c(\d+) m(\d+)")
TICKS = os.sysconf("SC_CLK_TCK")
FIRST = 100  # replies counted for "time until the first replies"
SETTLE_S = 5.0  # the burst's replies/s is checked from this second on


def answer(request: RecordedRequest) -> Reply:
    """The instant model: acknowledge the newest ``c<chat> m<n>`` of the last user turn."""
    content = request.messages[-1]["content"] if request.messages else ""
    text = content if isinstance(content, str) else " ".join(b.get("text", "") for b in content)
    found = _KEY.findall(text)
    return Reply(text=f"ack c{found[-1][0]} m{found[-1][1]}" if found else "ok")


# --- the anchor bot (runs in its own process: ``throughput.py --anchor-bot``) -------------


def anchor_bot(tg_root: str, token: str, anthropic_url: str) -> None:
    """Poll, ask the model, reply: the least a Telegram + Claude bot does."""
    from anthropic import AsyncAnthropic
    from telegram import Update
    from telegram.ext import ApplicationBuilder, ContextTypes, MessageHandler, filters

    client = AsyncAnthropic(base_url=anthropic_url, api_key="bench-key")

    async def on_text(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None and update.message.text is not None
        response = await client.messages.create(
            model=MODEL, max_tokens=1024, messages=[{"role": "user", "content": update.message.text}]
        )
        text = "".join(b.text for b in response.content if b.type == "text")
        await update.message.reply_text(text)

    app = (
        ApplicationBuilder()
        .token(token)
        .base_url(tg_root + "/bot")
        .base_file_url(tg_root + "/file/bot")
        .build()
    )
    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, on_text))
    app.run_polling(poll_interval=0.0, timeout=25, drop_pending_updates=False)


# --- measuring ----------------------------------------------------------------------------


@dataclass
class Ledger:
    """Answers as the fake received them, keyed by (chat, message number)."""

    pushed_at: dict[tuple[int, int], float] = field(default_factory=dict)
    answered_at: dict[tuple[int, int], float] = field(default_factory=dict)
    answers: int = 0
    waiters: dict[tuple[int, int], asyncio.Event] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    expected: int = 0

    def record(self, text: str) -> None:
        found = _KEY.search(text)
        if found is None:
            return
        key = (int(found[1]), int(found[2]))
        self.answers += 1
        if key in self.answered_at:
            return
        self.answered_at[key] = time.perf_counter()
        if key in self.waiters:
            self.waiters[key].set()
        if self.expected and len(self.answered_at) >= self.expected:
            self.done.set()


class BenchTelegram(FakeTelegram):
    """The fake Bot API, telling the ledger about every message the bot sends; it keeps
    no call log (a long run would only fill memory), just counts per method."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger()
        self.counts: dict[str, int] = {}

    async def _api_sendMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        message = await super()._api_sendMessage(params)
        self.ledger.record(str(message.get("text", "")))
        self.sent.clear()
        return message

    async def _handle(self, request: Any) -> Any:
        method = request.match_info["method"].lower()
        self.counts[method] = self.counts.get(method, 0) + 1
        try:
            return await super()._handle(request)
        finally:
            if len(self.calls) > 50:
                del self.calls[:-50]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@dataclass(frozen=True)
class LoadResult:
    replies: int
    wall_s: float
    cpu_s: float
    latencies_ms: list[float]
    typing: int
    first_s: float | None = None  # time until the first FIRST replies (burst)
    low_rate: float | None = None  # lowest replies/s over 1-s windows after SETTLE_S (burst)

    @property
    def rate(self) -> float:
        return self.replies / max(self.wall_s, 1e-9)

    @property
    def cpu_ms(self) -> float:
        return self.cpu_s * 1000 / max(self.replies, 1)


async def conversations(fake: BenchTelegram, pid: int, chats: int, messages: int, base: int) -> LoadResult:
    ledger = fake.ledger
    typing0 = fake.counts.get("sendchataction", 0)

    async def talk(chat: int) -> None:
        for n in range(messages):
            key = (chat, n)
            event = ledger.waiters[key] = asyncio.Event()
            ledger.pushed_at[key] = time.perf_counter()
            fake.push_text(chat, chat, f"c{chat} m{n} — what do you think about this?")
            try:
                await asyncio.wait_for(event.wait(), 120)
            except TimeoutError:
                return

    cpu0, start = cpu_seconds(pid), time.perf_counter()
    await asyncio.gather(*(talk(base + c) for c in range(chats)))
    keys = [(base + c, n) for c in range(chats) for n in range(messages)]
    done = [k for k in keys if k in ledger.answered_at]
    end = max((ledger.answered_at[k] for k in done), default=start)
    cpu = cpu_seconds(pid) - cpu0
    return LoadResult(
        replies=len(done),
        wall_s=end - start,
        cpu_s=cpu,
        latencies_ms=[(ledger.answered_at[k] - ledger.pushed_at[k]) * 1000 for k in done],
        typing=fake.counts.get("sendchataction", 0) - typing0,
    )


async def burst(fake: BenchTelegram, pid: int, chats: int, base: int, timeout: float) -> LoadResult:
    ledger = fake.ledger
    typing0 = fake.counts.get("sendchataction", 0)
    keys = [(base + c, 0) for c in range(chats)]
    ledger.done = asyncio.Event()
    ledger.expected = len(ledger.answered_at) + chats
    cpu0, start = cpu_seconds(pid), time.perf_counter()
    for chat, n in keys:
        ledger.pushed_at[(chat, n)] = start
        fake.push_text(chat, chat, f"c{chat} m{n} — everyone, look at this!")
    try:
        await asyncio.wait_for(ledger.done.wait(), timeout)
    except TimeoutError:
        pass
    cpu = cpu_seconds(pid) - cpu0
    times = sorted(ledger.answered_at[k] - start for k in keys if k in ledger.answered_at)
    end = times[-1] if times else 0.0
    first = times[FIRST - 1] if len(times) >= FIRST else None
    low = None
    if end > SETTLE_S + 1:
        # Whole 1-s windows from SETTLE_S until the last reply: the slowest one.
        windows = int(end - SETTLE_S)
        low = min(sum(1 for t in times if SETTLE_S + i <= t < SETTLE_S + i + 1) for i in range(windows))
    return LoadResult(
        replies=len(times),
        wall_s=end,
        cpu_s=cpu,
        latencies_ms=[t * 1000 for t in times],
        typing=fake.counts.get("sendchataction", 0) - typing0,
        first_s=first,
        low_rate=None if low is None else float(low),
    )


# --- the two bots ---------------------------------------------------------------------------


def bot_env(fake: FakeTelegram, emulator: Emulator) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
    }
    env.update(
        TELEGRAM_BOT_TOKEN=fake.token,
        TELEGRAM_API_BASE_URL=fake.root,
        ANTHROPIC_BASE_URL=emulator.base_url,
        ANTHROPIC_API_KEY="bench-key",
        PYTHONPATH=str(ROOT),
    )
    return env


def write_profile(home: Path, extra: dict[str, Any]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "access": {"allowed": ["telegram:*"]},
        "web": {"enabled": False, "port": 0},
        "gateway": {"debounce_s": 0.0},
        "logging": {"level": "warning"},
    }
    for dotted, value in extra.items():
        section, key = dotted.split(".", 1)
        config.setdefault(section, {})[key] = value
    (home / "config.yaml").write_text(yaml.safe_dump(config))


async def start_bot(which: str, fake: FakeTelegram, emulator: Emulator, workdir: Path, extra: dict[str, Any]):
    if which == "anchor":
        argv = [sys.executable, __file__, "--anchor-bot", fake.root, fake.token, emulator.base_url]
    else:
        home = workdir / "mnemo-home"
        shutil.rmtree(home, ignore_errors=True)
        write_profile(home, extra)
        argv = [sys.executable, "-m", "mnemo", "--home", str(home), "run"]
    log = (workdir / f"{which}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=bot_env(fake, emulator)
    )
    log.close()
    await fake.wait_for_poll(timeout=180)
    await asyncio.sleep(1.0)  # start-up work settles before the CPU clock is read
    return proc


async def stop_bot(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@dataclass(frozen=True)
class BotResult:
    chats: LoadResult
    burst: LoadResult


async def run_bot(which: str, args: argparse.Namespace, workdir: Path) -> BotResult:
    async with BenchTelegram() as fake, Emulator(responder=answer, record_limit=50) as emulator:
        proc = await start_bot(which, fake, emulator, workdir, dict(args.config))
        try:
            assert proc.pid is not None
            chats = await conversations(fake, proc.pid, args.chats, args.messages, base=10_000)
            await asyncio.sleep(1.0)
            hit = await burst(fake, proc.pid, args.burst, base=100_000, timeout=args.burst_timeout)
        finally:
            await stop_bot(proc)
    return BotResult(chats, hit)


# --- database round trips ---------------------------------------------------------------


async def db_round_trips(messages: int, postgres_url: str | None) -> float:
    """Round trips per plain message through the whole pipeline (loopback adapter,
    instant emulator), counted by the Database's hook."""
    from mnemo.app import open_app
    from mnemo.gateway.config import load_settings
    from tests.support.loopback import LoopbackAdapter

    workdir = Path(tempfile.mkdtemp(prefix="mnemo-bench-trips-"))
    overrides: dict[str, Any] = {
        "access.allowed": ("loop:*",),
        "gateway.debounce_s": 0.0,
        "web.enabled": False,
    }
    if postgres_url is not None:
        overrides["database.url"] = postgres_url
    settings = load_settings(workdir, overrides=overrides, environ={})
    adapter = LoopbackAdapter()
    try:
        async with (
            Emulator(responder=answer) as emulator,
            open_app(settings, adapters=[adapter], llm_base_url=emulator.base_url, api_key="bench") as app,
        ):
            await adapter.say("c1 m0 warm up", user="1")  # the session starts: not a plain message
            await adapter.wait_sent(1)
            await app.gateway.lanes.drain(5)
            trips = app.db.round_trips
            for n in range(1, messages + 1):
                await adapter.say(f"c1 m{n} hello", user="1")
                await adapter.wait_sent(n + 1)
                await app.gateway.lanes.drain(5)
            await asyncio.sleep(0.2)  # delivery's own bookkeeping
            return (app.db.round_trips - trips) / messages
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --- report ----------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "—" if v is None or v != v else format(v, spec)


ROWS: list[tuple[str, Callable[[BotResult], float | None], str]] = [
    ("conversations: replies/s", lambda r: r.chats.rate, ".1f"),
    ("conversations: CPU ms/reply", lambda r: r.chats.cpu_ms, ".2f"),
    (
        "conversations: latency p50 ms",
        lambda r: statistics.median(r.chats.latencies_ms or [float("nan")]),
        ".0f",
    ),
    ("conversations: latency p95 ms", lambda r: percentile(r.chats.latencies_ms, 0.95), ".0f"),
    ("conversations: typing/reply", lambda r: r.chats.typing / max(r.chats.replies, 1), ".2f"),
    ("burst: replies", lambda r: float(r.burst.replies), ".0f"),
    ("burst: replies/s", lambda r: r.burst.rate, ".1f"),
    ("burst: CPU ms/reply", lambda r: r.burst.cpu_ms, ".2f"),
    ("burst: first 100 replies s", lambda r: r.burst.first_s, ".2f"),
    ("burst: lowest replies/s after 5 s", lambda r: r.burst.low_rate, ".0f"),
    ("burst: latency p50 ms", lambda r: statistics.median(r.burst.latencies_ms or [float("nan")]), ".0f"),
    ("burst: latency p95 ms", lambda r: percentile(r.burst.latencies_ms, 0.95), ".0f"),
    ("burst: typing/reply", lambda r: r.burst.typing / max(r.burst.replies, 1), ".2f"),
]


def print_run(n: int, anchor: BotResult, mnemo: BotResult) -> dict[str, float | None]:
    print(f"\nrun {n}   (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    print(f"  {'':38} {'anchor':>9} {'mnemo':>9} {'mnemo/anchor':>13}")
    ratios: dict[str, float | None] = {}
    for name, get, spec in ROWS:
        a, m = get(anchor), get(mnemo)
        ratios[name] = ratio(m, a)
        print(f"  {name:38} {fmt(a, spec):>9} {fmt(m, spec):>9} {fmt(ratios[name], '.2f'):>13}")
    # The burst's rate target compares mnemo's slowest second with the anchor's mean.
    ratios["low vs anchor mean"] = ratio(mnemo.burst.low_rate, anchor.burst.rate)
    print(
        f"  {'burst: mnemo lowest replies/s / anchor mean':52} {fmt(ratios['low vs anchor mean'], '.2f'):>13}"
    )
    return ratios


def check(medians: dict[str, float | None]) -> bool:
    targets = [
        (
            "CPU ms per reply at the conversations' load ≤ 1.5× the anchor's",
            "conversations: CPU ms/reply",
            1.5,
            "le",
        ),
        ("burst: first 100 replies ≤ 2× the anchor's time", "burst: first 100 replies s", 2.0, "le"),
        ("burst: lowest replies/s after 5 s ≥ 0.5× the anchor's", "low vs anchor mean", 0.5, "ge"),
    ]
    ok = True
    print("\ntargets (medians of the runs)")
    for label, key, bound, how in targets:
        value = medians.get(key)
        if value is None:
            # No window after 5 s: the burst was over before it (never slow).
            met = key == "low vs anchor mean"
            shown = "no reply due after 5 s" if met else "—"
        else:
            met = value <= bound if how == "le" else value >= bound
            shown = f"{value:.2f}"
        ok = ok and met
        print(f"  {'met ' if met else 'MISSED'} {label}: {shown}")
    return ok


async def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chats", type=int, default=200)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--burst-timeout", type=float, default=300.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--only", choices=("anchor", "mnemo"), help="run one bot only (no ratios)")
    parser.add_argument(
        "--set", dest="config", action="append", default=[], type=lambda s: s.split("=", 1),
        help="a config key for mnemo, e.g. --set gateway.max_concurrent_turns=16 (YAML value)",
    )  # fmt: skip
    parser.add_argument("--db-trips", action="store_true", help="count database round trips per message")
    parser.add_argument("--pg", action="store_true", help="with --db-trips: on PostgreSQL too")
    parser.add_argument("--keep", action="store_true", help="keep the profiles and logs")
    args = parser.parse_args()
    args.config = [(k, yaml.safe_load(v)) for k, v in args.config]
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    workdir = Path(tempfile.mkdtemp(prefix="mnemo-bench-throughput-"))
    print(
        f"{args.chats} conversations × {args.messages} messages, then a burst of {args.burst} chats;"
        f" {args.runs} run(s); logs in {workdir}"
    )
    all_ratios: list[dict[str, float | None]] = []
    for n in range(1, args.runs + 1):
        if args.only:
            result = await run_bot(args.only, args, workdir)
            print(f"\n{args.only}, run {n} (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
            for name, get, spec in ROWS:
                print(f"  {name:38} {fmt(get(result), spec):>9}")
            continue
        anchor = await run_bot("anchor", args, workdir)
        mnemo = await run_bot("mnemo", args, workdir)
        all_ratios.append(print_run(n, anchor, mnemo))
    ok = True
    if all_ratios:
        medians: dict[str, float | None] = {}
        print(f"\nmedian mnemo/anchor over {len(all_ratios)} run(s)")
        for key in all_ratios[0]:
            values = [r[key] for r in all_ratios if r[key] is not None]
            medians[key] = statistics.median(values) if values else None
            print(f"  {key:52} {fmt(medians[key], '.2f'):>13}")
        ok = check(medians)
    if args.db_trips:
        print("\ndatabase round trips per plain message")
        print(f"  SQLite      {await db_round_trips(20, None):.1f}")
        if args.pg:
            from tests.support.pgcluster import running_cluster

            with running_cluster() as cluster:
                print(f"  PostgreSQL  {await db_round_trips(20, cluster.fresh_database()):.1f}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--anchor-bot":
        anchor_bot(*sys.argv[2:5])
    else:
        raise SystemExit(asyncio.run(main()))
