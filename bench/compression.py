"""Compression over a long conversation: how often, how much, at what cost.

    python bench/compression.py [--turns 500] [--window 16384] [--seed 7]

A scripted 500-turn conversation (varied message sizes, a memory-tool call every
so often) goes through the whole pipeline — loopback adapter, gateway, agent, real
``anthropic`` SDK — against the emulator, twice:

1. **compressed**: a small context window (``llm.context_window``), compression on;
   background jobs (flush, summary, memory review) run as they would in production
   and are waited for after each turn so the run is reproducible;
2. **uncompressed**: compression off on a large window (1M tokens), the whole history
   sent every turn.

Printed: the number of compressions, the estimated request size before/after each,
the time spent in the compressor itself (planning, summary prompt, assembly — LLM
calls excluded), and the prompt tokens of both runs (chat requests and background
requests apart; input, cache reads, cache writes, and an input-price equivalent where
a cache read costs 0.1 and a cache write 1.25 of an input token). Token counts are the
emulator's estimate (~4 characters per token), so the figures are indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnemo.app import open_app
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply, ToolUse, trial_reply
from mnemo.gateway.logs import configure_logging
from mnemo.memory.flush import BACKGROUND_TAG
from tests.support.loopback import LoopbackAdapter

BASE = {
    "access.allowed": ("loop:*",),
    "access.rate_limit_per_minute": 0,
    "gateway.debounce_s": 0.0,
    "llm.max_tokens": 1024,
    # 500 turns in a minute would meet memory.upkeep's per-session hourly limit, which is
    # meant for real time (the daily caps stay as configured).
    "memory.upkeep.session_passes_per_hour": None,
}
TOPICS = [
    "the harbour",
    "a parser bug",
    "tomorrow's trip",
    "the garden",
    "a SQL query",
    "a birthday",
    "the budget",
]
WORDS = (
    "the a of to and in that it with for on as was at by this be from or have an they which one you".split()
)


@dataclass
class Tokens:
    requests: int = 0
    input: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def add(self, usage: dict) -> None:
        self.requests += 1
        self.input += usage.get("input_tokens", 0)
        self.cache_read += usage.get("cache_read_input_tokens", 0) or 0
        self.cache_write += usage.get("cache_creation_input_tokens", 0) or 0

    @property
    def prompt(self) -> int:
        return self.input + self.cache_read + self.cache_write

    @property
    def input_equivalent(self) -> float:
        return self.input + 0.1 * self.cache_read + 1.25 * self.cache_write


@dataclass
class Run:
    chat: Tokens = field(default_factory=Tokens)
    background: Tokens = field(default_factory=Tokens)
    compressions: list = field(default_factory=list)
    seconds: float = 0.0
    sessions: int = 0


def script(turns: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(turns):
        topic = rng.choice(TOPICS)
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 120)))
        if i % 37 == 5:
            out.append(
                f"Please remember that I prefer {rng.choice(['tea', 'short answers', 'metric units'])}. {body}"
            )
        else:
            out.append(f"Turn {i} about {topic}: {body}")
    return out


class Model:
    """Instant scripted model: varied reply sizes, memory writes when asked, the trial
    model's summaries and reviews for background requests."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed + 1)

    def __call__(self, request: RecordedRequest) -> Reply:
        tools = request.tool_names
        last = request.messages[-1]["content"]
        text = (
            last
            if isinstance(last, str)
            else " ".join(b.get("text", "") for b in last if b.get("type") == "text")
        )
        if (
            BACKGROUND_TAG in text
            or not tools
            or any(b.get("type") == "tool_result" for b in last if isinstance(last, list))
        ):
            return trial_reply(request)
        if "remember that" in text and "memory" in tools:
            fact = text.split("remember that", 1)[1].split(".")[0].strip().replace("I prefer", "User prefers")
            return Reply(
                tool_uses=[ToolUse("memory", {"action": "add", "target": "user", "content": fact + "."})]
            )
        words = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(30, 200)))
        return Reply(text=f"About that: {words}.")


def background(request: RecordedRequest) -> bool:
    """Background passes are sent after the conversation, their instruction tagged."""
    last = request.messages[-1]["content"]
    text = (
        last
        if isinstance(last, str)
        else " ".join(b.get("text", "") for b in last if b.get("type") == "text")
    )
    return BACKGROUND_TAG in text or not request.tool_names


async def run(turns: int, overrides: dict, seed: int) -> Run:
    result = Run()
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(Path(tmp), environ={}, overrides={**BASE, **overrides})
        async with Emulator(responder=Model(seed)) as emu:
            adapter = LoopbackAdapter()
            async with open_app(
                settings, adapters=[adapter], llm_base_url=emu.base_url, api_key="k", trial=False
            ) as app:
                started = time.perf_counter()
                for i, text in enumerate(script(turns, seed)):
                    await adapter.say(text, user="ada")
                    await adapter.wait_sent(i + 1, timeout=120)
                    await app.gateway.lanes.drain(60)
                    await app.jobs.wait_idle(120)
                result.seconds = time.perf_counter() - started
                result.compressions = [c for c in app.housekeeping.compressions if c.new_session_id]
                result.sessions = len(await app.store.list_sessions("loop:dm:ada", limit=10_000))
            for rec in emu.requests:
                if rec.usage is not None:
                    (result.background if background(rec) else result.chat).add(rec.usage)
    return result


def show(name: str, r: Run) -> None:
    total = Tokens(
        r.chat.requests + r.background.requests,
        r.chat.input + r.background.input,
        r.chat.cache_read + r.background.cache_read,
        r.chat.cache_write + r.background.cache_write,
    )
    print(f"\n== {name}: {r.sessions} session(s), {r.seconds:.1f} s wall time")
    for label, t in (("chat", r.chat), ("background", r.background), ("total", total)):
        print(
            f"  {label:<10} {t.requests:>5} requests  prompt {t.prompt:>12,}  (input {t.input:,}, cache read "
            f"{t.cache_read:,}, cache write {t.cache_write:,})  input-equivalent {t.input_equivalent:>14,.0f}"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--window", type=int, default=16_384)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    configure_logging("error", "console")

    small = await run(args.turns, {"llm.context_window": args.window}, args.seed)
    large = await run(args.turns, {"llm.context_window": 1_000_000, "compression.enabled": False}, args.seed)

    print(f"{args.turns} turns; compressed run on a {args.window:,}-token window (threshold 50%)")
    print(f"\ncompressions: {len(small.compressions)}")
    for k, c in enumerate(small.compressions, 1):
        if k <= 5 or k > len(small.compressions) - 3:
            print(
                f"  #{k:<3} tokens {c.tokens_before:>6,} -> {c.tokens_after:>6,}  "
                f"({c.summarised_messages} messages summarised{', fallback summary' if c.fallback else ''})"
            )
        elif k == 6:
            print("  ...")
    if small.compressions:
        ms = [c.compressor_s * 1000 for c in small.compressions]
        before = statistics.mean(c.tokens_before for c in small.compressions)
        after = statistics.mean(c.tokens_after for c in small.compressions)
        print(f"  mean {before:,.0f} -> {after:,.0f} tokens ({100 * (1 - after / before):.0f}% smaller)")
        print(f"  compressor time (no LLM): median {statistics.median(ms):.2f} ms, max {max(ms):.2f} ms")
    show("compressed, small window", small)
    show("uncompressed, 1M window", large)
    ratio = (small.chat.prompt + small.background.prompt) / max(
        1, large.chat.prompt + large.background.prompt
    )
    eq = (small.chat.input_equivalent + small.background.input_equivalent) / max(
        1.0, large.chat.input_equivalent + large.background.input_equivalent
    )
    print(f"\nprompt tokens, compressed / uncompressed: {ratio:.2f}; input-price equivalent: {eq:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
