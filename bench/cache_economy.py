"""Cache economy: a scripted 40-turn DM with 3 memory writes, mnemo vs a naive agent.

    python bench/cache_economy.py [--turns 40] [--min-cacheable 1024] [--model claude-sonnet-4-6]

Both runs go through the real ``anthropic`` SDK to the local emulator, which accounts
prompt caching like the API (prefix per breakpoint, minimum cacheable length, TTL):

* **mnemo** — the whole gateway pipeline: frozen system prompt per session,
  "system_and_3" cache breakpoints, memory writes reaching disk at once but the prompt
  only at the next session;
* **naive** — the same conversation and replies, but the memory is re-rendered into
  the system prompt on every turn and no cache breakpoints are sent.

Prints the share of input tokens served from the cache and the estimated cost of each,
and their ratio. Target: >= 85% of mnemo's input tokens from cache.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnemo.app import open_app
from mnemo.gateway.budgets.charge import UNMETERED, Charge, RequestKind
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, Reply, ToolUse
from mnemo.gateway.llm.client import LLMClient, Usage, cost_usd
from mnemo.gateway.logs import configure_logging
from mnemo.gateway.turns.builtin_tools import memory_tool
from mnemo.gateway.turns.prompt import PromptParts, render_system_prompt
from mnemo.gateway.turns.tools import ToolRegistry
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.scope import AgentContext, UserRef
from tests.support.loopback import LoopbackAdapter

TURN = Charge(RequestKind.TURN)  # no gate here: the client on its own

TOPICS = [
    "my vegetable garden",
    "the sourdough starter",
    "a trip to Kyoto",
    "learning the cello",
    "our team offsite",
    "the new espresso machine",
    "a bug in the billing job",
    "marathon training",
    "my sister's wedding",
    "tax forms",
]
MEMORY_TURNS = {
    5: "User grows tomatoes and basil on a balcony.",
    15: "User prefers metric units.",
    25: "User's sister is called Mira.",
}


def user_text(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    return (
        f"Turn {turn}: I'd like your thoughts on {topic}. Keep in mind what we discussed before, "
        "and give me two or three concrete suggestions I could try this week."
    )


def reply_text(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    body = " ".join(
        f"Suggestion {i + 1} for {topic}: start small, write down what you tried, and compare after a few days."
        for i in range(3)
    )
    return f"Here are some ideas. {body} Tell me how it goes."


def script_for(turns: int) -> list[Reply]:
    items: list[Reply] = []
    for t in range(1, turns + 1):
        if t in MEMORY_TURNS:
            items.append(
                Reply(
                    tool_uses=[
                        ToolUse("memory", {"action": "add", "target": "user", "content": MEMORY_TURNS[t]})
                    ]
                )
            )
            items.append(Reply(text="Saved that. " + reply_text(t)))
        else:
            items.append(Reply(text=reply_text(t)))
    return items


async def run_mnemo(turns: int, min_cacheable: int, model: str) -> tuple[Usage, float]:
    with tempfile.TemporaryDirectory() as tmp:
        overrides = {"llm.model": model, "access.allowed": ("loop:*",), "access.rate_limit_per_minute": 0}
        settings = load_settings(Path(tmp), environ={}, overrides=overrides)
        async with Emulator(min_cacheable_tokens=min_cacheable) as emu:
            emu.script(*script_for(turns))
            adapter = LoopbackAdapter()
            async with open_app(
                settings, adapters=[adapter], llm_base_url=emu.base_url, api_key="k", trial=False
            ):
                for t in range(1, turns + 1):
                    await adapter.say(user_text(t), user="ada")
                    await adapter.wait_sent(t, timeout=60)
            usage = _usage(emu)
    return usage, cost_usd(settings.llm.prices, model, usage)


async def run_naive(turns: int, min_cacheable: int, model: str) -> tuple[Usage, float]:
    """No frozen snapshot, no breakpoints: memory re-rendered into every request."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(Path(tmp), environ={}, overrides={"llm.model": model})
        files = MemoryFiles(settings.memories_dir)
        user = files.user(UserRef("loop", "ada"))
        tools = ToolRegistry()
        tools.register(memory_tool(files, settings))
        schemas = tools.schemas(AgentContext.PRIMARY)
        async with Emulator(min_cacheable_tokens=min_cacheable) as emu:
            emu.script(*script_for(turns))
            llm = LLMClient(settings.llm, gate=UNMETERED, base_url=emu.base_url, api_key="k")
            history: list[dict] = []
            for t in range(1, turns + 1):
                history.append({"role": "user", "content": user_text(t)})
                while True:
                    system = render_system_prompt(
                        PromptParts(
                            persona=None,
                            memory_block=files.shared().load().render_block(),
                            user_block=user.load().render_block(),
                            platform="loop",
                        )
                    )
                    resp = await llm.create(
                        charge=TURN, system=system, messages=history, tools=schemas, cache=False
                    )
                    history.append({"role": "assistant", "content": list(resp.content)})
                    if not resp.tool_uses:
                        break
                    results = []
                    for call in resp.tool_uses:
                        user.add(call["input"]["content"])
                        results.append(
                            {"type": "tool_result", "tool_use_id": call["id"], "content": '{"success": true}'}
                        )
                    history.append({"role": "user", "content": results})
            await llm.aclose()
            usage = _usage(emu)
    return usage, cost_usd(settings.llm.prices, model, usage)


def _usage(emu: Emulator) -> Usage:
    u = emu.total_usage()
    return Usage(u.input_tokens, u.output_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens)


def share(u: Usage) -> float:
    return u.cache_read_tokens / u.prompt_tokens if u.prompt_tokens else 0.0


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--min-cacheable", type=int, default=1024)
    ap.add_argument("--model", default="claude-sonnet-4-6")
    args = ap.parse_args()
    configure_logging("warning")
    mnemo, mnemo_cost = await run_mnemo(args.turns, args.min_cacheable, args.model)
    naive, naive_cost = await run_naive(args.turns, args.min_cacheable, args.model)
    print(
        f"{args.turns}-turn DM, {len(MEMORY_TURNS)} memory writes, model {args.model}, "
        f"min cacheable {args.min_cacheable} tokens"
    )
    print(
        f"{'':8}{'prompt tok':>12}{'cache read':>12}{'cache write':>12}{'uncached':>10}{'from cache':>12}{'cost $':>10}"
    )
    for name, u, c in (("mnemo", mnemo, mnemo_cost), ("naive", naive, naive_cost)):
        print(
            f"{name:8}{u.prompt_tokens:>12,}{u.cache_read_tokens:>12,}{u.cache_write_tokens:>12,}"
            f"{u.input_tokens:>10,}{share(u):>11.1%}{c:>10.4f}"
        )
    print(
        f"cost ratio mnemo/naive: {mnemo_cost / naive_cost:.2f} ({1 - mnemo_cost / naive_cost:.0%} cheaper)"
    )
    print(f"target >= 85% from cache: {'met' if share(mnemo) >= 0.85 else 'NOT met'}")


if __name__ == "__main__":
    asyncio.run(main())
