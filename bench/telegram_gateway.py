"""Telegram gateway throughput, latency and crash safety, through the fake Bot API.

    python bench/telegram_gateway.py [--chats 200] [--messages 20] [--kill-at 0.5[,0.75…]] [--debounce 0]

``mnemo run`` runs as a real subprocess (``--home`` a fresh profile) with
``TELEGRAM_API_BASE_URL`` pointing at an in-process ``FakeTelegram`` and
``ANTHROPIC_BASE_URL`` at an instant emulator (it answers ``ack c<chat> m<n>`` at once).
Every chat is a conversation: a user sends message n+1 when the answer to message n
has arrived; all chats run concurrently.

1. Clean run: messages/s (messages answered / wall time from the first push to the
   last answer) and end-to-end latency p50/p99 (fake push → the fake receives the
   sendMessage carrying the answer).
2. Crash run (fresh profile): the same, but the gateway process gets SIGKILL when
   ``--kill-at`` of the answers have arrived (plus a random 0-200 ms, so that the kill
   is not synchronised with a send), and a new process is started on the same profile.
   Each message is then counted by how many answers it got: 0 (lost), 1, or 2+ (those
   labelled "possible duplicate" were sends in flight at the kill: Telegram has no
   idempotency key, so a reply that may have gone out is sent again, marked). Target:
   all exactly once; the exit status is 0 when nothing was lost and every repeat was
   labelled.

The gateway's debounce (``gateway.debounce_s``, 0.6 s by default: it waits for a burst
to end) is set to ``--debounce`` (0 by default) so the figures show the pipeline, not a
deliberate wait. Per-user rate limiting is off (``access.rate_limit_per_minute: 0``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply
from tests.fakes.telegram_api import FakeTelegram

MNEMO = [sys.executable, "-m", "mnemo"]
_KEY = re.compile(r"c(\d+) m(\d+)")
_DUPLICATE = "possible duplicate"


def answer(request: RecordedRequest) -> Reply:
    """The instant model: acknowledge the newest ``c<chat> m<n>`` of the last user turn."""
    content = request.messages[-1]["content"] if request.messages else ""
    text = content if isinstance(content, str) else " ".join(b.get("text", "") for b in content)
    found = _KEY.findall(text)
    return Reply(text=f"ack c{found[-1][0]} m{found[-1][1]}" if found else "ok")


@dataclass
class Ledger:
    """Answers as the fake received them, keyed by (chat, message number)."""

    pushed_at: dict[tuple[int, int], float] = field(default_factory=dict)
    answers: Counter[tuple[int, int]] = field(default_factory=Counter)
    labelled: Counter[tuple[int, int]] = field(default_factory=Counter)
    first_answer_at: dict[tuple[int, int], float] = field(default_factory=dict)
    waiters: dict[tuple[int, int], asyncio.Event] = field(default_factory=dict)
    milestones: list[tuple[int, asyncio.Event]] = field(default_factory=list)
    total: int = 0  # messages answered at least once

    def record(self, text: str) -> None:
        found = _KEY.search(text)
        if found is None:
            return
        key = (int(found[1]), int(found[2]))
        self.answers[key] += 1
        if _DUPLICATE in text:
            self.labelled[key] += 1
        if key not in self.first_answer_at:
            self.first_answer_at[key] = time.perf_counter()
            self.total += 1
            for threshold, event in self.milestones:
                if self.total >= threshold:
                    event.set()
        self.waiters.setdefault(key, asyncio.Event()).set()

    def when_answered(self, count: int) -> asyncio.Event:
        event = asyncio.Event()
        self.milestones.append((count, event))
        if self.total >= count:
            event.set()
        return event


class BenchTelegram(FakeTelegram):
    """The fake Bot API, telling the ledger about every message the bot sends."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__()
        self.ledger = ledger

    async def _api_sendMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        message = await super()._api_sendMessage(params)
        self.ledger.record(str(message.get("text", "")))
        return message


def write_profile(home: Path, debounce: float) -> None:
    home.mkdir(parents=True, exist_ok=True)
    config = {
        "access": {"allowed": ["telegram:*"], "rate_limit_per_minute": 0},
        "web": {"enabled": False, "port": 0},
        "gateway": {"debounce_s": debounce},
        "logging": {"level": "warning"},
    }
    (home / "config.yaml").write_text(yaml.safe_dump(config))


async def start_gateway(
    home: Path, fake: FakeTelegram, emulator: Emulator, log_name: str
) -> asyncio.subprocess.Process:
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
    )
    polls = len(fake.calls_to("getUpdates"))
    log = (home / log_name).open("wb")
    proc = await asyncio.create_subprocess_exec(
        *MNEMO, "--home", str(home), "run", stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
    )
    log.close()
    await fake.wait_for_call("getUpdates", polls + 1, timeout=120)  # receiving
    return proc


async def converse(fake: FakeTelegram, ledger: Ledger, chat: int, messages: int, timeout: float) -> None:
    for n in range(messages):
        key = (chat, n)
        event = ledger.waiters.setdefault(key, asyncio.Event())
        ledger.pushed_at[key] = time.perf_counter()
        fake.push_text(chat, chat, f"c{chat} m{n} — what do you think about this?")
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            continue  # counted as unanswered; the conversation goes on


@dataclass(frozen=True)
class RunResult:
    wall_s: float
    answered: int
    latencies_ms: list[float]
    counts: Counter[int]
    labelled_duplicates: int
    restarts_s: list[float]  # kill -9 → the new process polling, per kill


async def run(
    chats: int, messages: int, debounce: float, kills: list[float], workdir: Path, rng: random.Random
) -> RunResult:
    """One run on a fresh profile; ``kills``: shares of the answers after which the
    gateway gets SIGKILL (after a random 0-200 ms more, so the kill is not timed to a
    send) and is started again."""
    ledger = Ledger()
    home = workdir / ("crash" if kills else "clean")
    write_profile(home, debounce)
    total = chats * messages
    async with BenchTelegram(ledger) as fake, Emulator(responder=answer, record_limit=200) as emulator:
        proc = await start_gateway(home, fake, emulator, "gateway-1.log")
        restarts: list[float] = []
        start = time.perf_counter()
        talks = [
            asyncio.create_task(converse(fake, ledger, 1000 + c, messages, timeout=120)) for c in range(chats)
        ]
        try:
            for number, share in enumerate(kills, start=2):
                await ledger.when_answered(max(1, int(total * share))).wait()
                await asyncio.sleep(rng.uniform(0.0, 0.2))
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
                killed = time.perf_counter()
                proc = await start_gateway(home, fake, emulator, f"gateway-{number}.log")
                restarts.append(time.perf_counter() - killed)
            await asyncio.gather(*talks)
            wall = max(ledger.first_answer_at.values(), default=start) - start
            await asyncio.sleep(2.0)  # late duplicates still count
        finally:
            for task in talks:
                task.cancel()
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 30)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        keys = [(1000 + c, n) for c in range(chats) for n in range(messages)]
        latencies = [
            (ledger.first_answer_at[k] - ledger.pushed_at[k]) * 1000
            for k in keys
            if k in ledger.first_answer_at
        ]
        return RunResult(
            wall_s=wall,
            answered=len(latencies),
            latencies_ms=latencies,
            counts=Counter(min(ledger.answers[k], 2) for k in keys),
            labelled_duplicates=sum(1 for k in keys if ledger.answers[k] >= 2 and ledger.labelled[k] >= 1),
            restarts_s=restarts,
        )


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def report(title: str, total: int, result: RunResult) -> None:
    lat = result.latencies_ms
    print(f"\n{title}")
    print(f"  answered            {result.answered}/{total} in {result.wall_s:.1f} s")
    print(f"  messages/s          {result.answered / max(result.wall_s, 1e-9):.1f}")
    p50, p99 = statistics.median(lat), percentile(lat, 0.99)
    print(f"  latency p50 / p99   {p50:.0f} ms / {p99:.0f} ms (max {max(lat):.0f} ms)")
    zero, one, more = (result.counts.get(n, 0) for n in (0, 1, 2))
    labelled = f" ({result.labelled_duplicates} labelled 'possible duplicate')" if more else ""
    print(f"  answered 0 / 1 / 2+ times   {zero} / {one} / {more}{labelled}")
    if result.restarts_s:
        shown = ", ".join(f"{s:.1f}" for s in result.restarts_s)
        print(f"  kill -9 → new process polling: {shown} s")


async def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chats", type=int, default=200)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument(
        "--kill-at",
        default="0.5",
        help="comma-separated shares of the answers after which to kill, e.g. 0.25,0.5,0.75",
    )
    parser.add_argument("--debounce", type=float, default=0.0, help="gateway.debounce_s for the run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the profiles (logs, state.db)")
    parser.add_argument("--skip-clean", action="store_true", help="only the crash run")
    args = parser.parse_args()
    # A killed gateway leaves half-sent requests; aiohttp would print each reset connection.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    kills = sorted(float(k) for k in args.kill_at.split(","))
    total = args.chats * args.messages
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="mnemo-bench-telegram-"))
    print(f"{args.chats} chats x {args.messages} messages, debounce {args.debounce} s, profiles in {workdir}")
    if not args.skip_clean:
        clean = await run(args.chats, args.messages, args.debounce, [], workdir, rng)
        report("clean run", total, clean)
    crash = await run(args.chats, args.messages, args.debounce, kills, workdir, rng)
    shares = ", ".join(f"{k:.0%}" for k in kills)
    report(f"kill -9 after {shares} of the answers, each followed by a restart", total, crash)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    zero, one, more = (crash.counts.get(n, 0) for n in (0, 1, 2))
    if one == total:
        print("\ncrash run: every message answered exactly once")
    elif zero == 0 and more == crash.labelled_duplicates:
        print("\ncrash run: nothing lost; every repeat was a send in flight at a kill, labelled as such")
    else:
        print("\ncrash run: messages LOST or repeated without a label")
    return 0 if zero == 0 and more == crash.labelled_duplicates else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
