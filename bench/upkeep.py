"""Upkeep: what background memory work costs next to the conversation it serves.

    python bench/upkeep.py [--turns 500] [--window 16384] [--seed 7] [--nudge 10]

The scripted conversation of ``bench/compression.py`` (varied message sizes, a "please
remember" every so often) goes through the whole pipeline — loopback adapter, gateway,
agent, real ``anthropic`` SDK — against the emulator, which accounts prompt caching like
the API (prefix per breakpoint, minimum cacheable length, TTL), twice in one run:

1. **with upkeep**: a small context window, compression on, memory reviews every
   ``--nudge`` turns; every background job (flush, summary, review) runs as in
   production and is waited for after each turn, so the run is reproducible; at the
   end one consolidation of the person's profile (``memory.consolidation``);
2. **uncompressed**: the same chat on a 1M window with compression off (reviews and
   the consolidation, when the profile has two entries or more) — the whole history sent
   every turn, with caching.

Printed for each run and per kind of request (chat, flush, summary, review, …):
requests, input tokens (everything the model read), the share read from the cache,
cache writes, and the cost from the price table of the request's model. Then the cost
of the compressed run relative to the uncompressed one. Token counts are the
emulator's estimate (~4 characters per token), so the figures are indicative.

Targets (issue 28): background requests read >= 70% of their input from the cache; the
compressed chat costs <= 0.20x the uncompressed one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.compression import BASE, WORDS, script
from mnemo.app import open_app
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply, ToolUse, trial_reply
from mnemo.gateway.llm.client import cost_usd
from mnemo.gateway.logs import configure_logging
from mnemo.memory.consolidation import CONSOLIDATION_SYSTEM
from mnemo.memory.flush import BACKGROUND_TAG
from mnemo.memory.scope import UserRef
from mnemo.memory.usage import Usage
from tests.support.loopback import LoopbackAdapter


def last_text(request: RecordedRequest) -> str:
    last = request.messages[-1]["content"] if request.messages else ""
    if isinstance(last, str):
        return last
    return "\n".join(b.get("text", "") for b in last if b.get("type") == "text")


def kind_of(request: RecordedRequest) -> str:
    """chat, or the background kind, from the tagged instruction after the conversation."""
    if request.system_text == CONSOLIDATION_SYSTEM:
        return "consolidation"
    text = last_text(request)
    if BACKGROUND_TAG not in text:
        return "chat"
    if re.search(r"^## Goal", text, re.M):
        return "summary"
    if "Review the recent turns" in text:
        return "review"
    return "flush"


@dataclass
class Tally:
    requests: int = 0
    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0

    def add(self, usage: Usage, cost: float) -> None:
        self.requests += 1
        self.usage = self.usage + usage
        self.cost += cost

    @property
    def input_equivalent(self) -> float:
        """Prompt tokens at input price: a cache read costs 0.1, a write 1.25 of one."""
        u = self.usage
        return u.input_tokens + 0.1 * u.cache_read_tokens + 1.25 * u.cache_write_tokens

    @property
    def read_share(self) -> float:
        total = self.usage.prompt_tokens
        return self.usage.cache_read_tokens / total if total else 0.0


@dataclass
class Run:
    kinds: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    compressions: int = 0
    seconds: float = 0.0
    saved: list[int] = field(default_factory=list)  # tokens each later request no longer sends
    spent: list[Usage] = field(default_factory=list)  # what each compression's requests cost

    def total(self, *, background: bool | None = None) -> Tally:
        out = Tally()
        for kind, t in self.kinds.items():
            if background is None or (kind != "chat") == background:
                out.requests += t.requests
                out.usage = out.usage + t.usage
                out.cost += t.cost
        return out


class Model:
    """Instant scripted model: varied reply sizes, memory writes when asked, the trial
    model's summaries and reviews for background requests."""

    def __init__(self, seed: int) -> None:
        import random

        self.rng = random.Random(seed + 1)

    def __call__(self, request: RecordedRequest) -> Reply:
        last = request.messages[-1]["content"]
        text = last_text(request)
        if request.system_text == CONSOLIDATION_SYSTEM:  # one duplicate to merge, as JSON
            return Reply(text=json.dumps([{"op": "remove", "entry": 1, "why": "duplicate"}]))
        if BACKGROUND_TAG in text or (
            isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        ):
            return trial_reply(request)
        if "remember that" in text and "memory" in request.tool_names:
            fact = text.split("remember that", 1)[1].split(".")[0].strip().replace("I prefer", "User prefers")
            return Reply(
                tool_uses=[ToolUse("memory", {"action": "add", "target": "user", "content": fact + "."})]
            )
        words = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(30, 200)))
        return Reply(text=f"About that: {words}.")


async def run(turns: int, overrides: dict[str, object], seed: int) -> Run:
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
                # One nightly consolidation of the person's profile.
                assert app.consolidation is not None
                owner = app.files.user(UserRef("loop", "ada")).owner
                await app.consolidation.enqueue_all(app.jobs, [owner], "bench")
                await app.jobs.wait_idle(120)
                done = [c for c in app.housekeeping.compressions if c.new_session_id]
                result.compressions = len(done)
                result.saved = [c.tokens_saved for c in done]
                result.spent = [c.spent for c in done]
            for rec in emu.requests:
                if rec.usage is None:
                    continue
                u = rec.usage
                usage = Usage(
                    input_tokens=u.get("input_tokens", 0),
                    output_tokens=u.get("output_tokens", 0),
                    cache_read_tokens=u.get("cache_read_input_tokens", 0) or 0,
                    cache_write_tokens=u.get("cache_creation_input_tokens", 0) or 0,
                )
                result.kinds[kind_of(rec)].add(usage, cost_usd(settings.llm.prices, rec.model, usage))
    return result


def show_compressions(r: Run) -> None:
    if not r.saved:
        return
    n = len(r.saved)
    spent_tokens = sum(u.prompt_tokens + u.output_tokens for u in r.spent) / n
    read = sum(u.cache_read_tokens for u in r.spent) / max(1, sum(u.prompt_tokens for u in r.spent))
    print(
        f"  per compression: {sum(r.saved) / n:,.0f} tokens fewer in every later request; spent "
        f"{spent_tokens:,.0f} tokens ({read:.0%} cache reads), ${sum(u.cost_usd for u in r.spent) / n:.4f}"
    )


def show(name: str, r: Run) -> None:
    print(f"\n== {name}: {r.compressions} compression(s), {r.seconds:.1f} s wall time")
    header = f"{'requests':>9}{'input tokens':>15}{'cache read':>12}{'cache write':>13}{'output':>9}{'cost USD':>11}"
    print(f"  {'kind':<14}{header}")
    rows = [(k, r.kinds[k]) for k in sorted(r.kinds, key=lambda k: (k != "chat", k))]
    rows += [("background", r.total(background=True)), ("whole run", r.total())]
    for label, t in rows:
        print(
            f"  {label:<14}{t.requests:>9,}{t.usage.prompt_tokens:>15,}{t.read_share:>12.0%}"
            f"{t.usage.cache_write_tokens:>13,}{t.usage.output_tokens:>9,}{t.cost:>11.4f}"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--window", type=int, default=16_384)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--nudge", type=int, default=10, help="memory.nudge_interval (a review every N turns)"
    )
    args = parser.parse_args()
    configure_logging("error", "console")

    # BASE lifts the per-session hourly limit; the profile has a few entries only.
    common = {"memory.nudge_interval": args.nudge, "memory.consolidation.min_entries": 2}
    small = await run(args.turns, {**common, "llm.context_window": args.window}, args.seed)
    large = await run(
        args.turns, {**common, "llm.context_window": 1_000_000, "compression.enabled": False}, args.seed
    )
    print(
        f"{args.turns} turns; compressed on a {args.window:,}-token window (threshold 50%), review every {args.nudge}"
    )
    show("with upkeep (compressed)", small)
    show_compressions(small)
    show("uncompressed, 1M window", large)
    bg = small.total(background=True)
    ratio = small.total().cost / max(1e-12, large.total().cost)
    print(f"\nbackground cache-read share: {bg.read_share:.0%} (target >= 70%)")
    print(f"cost, compressed / uncompressed: {ratio:.3f}x (target <= 0.20x)")
    eq = small.total().input_equivalent / max(1.0, large.total().input_equivalent)
    print(f"input-price equivalent (bench/compression.py's measure), compressed / uncompressed: {eq:.3f}x")


if __name__ == "__main__":
    asyncio.run(main())
