"""``mnemo demo``: a short scripted conversation through the whole pipeline, offline.

Everything real except the model: the gateway, lanes, the stateless agent, the memory
tool writing USER.md, the session store and search, the outbox — and the real
``anthropic`` SDK talking to the in-process emulator, whose *scripted* trial model
answers. Runs in a throw-away home unless ``--home`` is given explicitly.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from mnemo.gateway.config import Settings, load_settings
from mnemo.memory.scope import UserRef

SCRIPT = [
    "Hi! My name is Ada and I prefer short answers.",
    "I'm planning a trip to Lisbon in May, mostly for the tiles and the food.",
    "/reset",
    "Hello again!",
    "What did I say about Lisbon?",
    "/status",
]
DEMO_CACHE_MIN_TOKENS = 256


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run a short scripted conversation offline and show what the memory did")
    p.set_defaults(handler=run)


def _rule(title: str) -> str:
    return f"\n── {title} " + "─" * max(0, 60 - len(title))


async def _demo(settings: Settings, out: TextIO) -> int:
    from mnemo.adapters.console import ConsoleAdapter
    from mnemo.app import open_app
    from mnemo.gateway.emulator import TRIAL_LABEL, Emulator

    print("mnemo demo — replies come from a SCRIPTED model (the offline emulator), not Claude.", file=out)
    print(f"Scripted replies are labelled {TRIAL_LABEL!r}. Home: {settings.home}", file=out)
    print(_rule("conversation"), file=out)
    console = ConsoleAdapter(
        "ada", stdin=io.StringIO("\n".join(SCRIPT) + "\n"), stdout=out, interactive=False, transcript=True
    )
    async with Emulator(min_cacheable_tokens=DEMO_CACHE_MIN_TOKENS) as emu:
        async with open_app(
            settings, adapters=[console], llm_base_url=emu.base_url, api_key="demo", trial=False
        ) as app:
            await console.finished.wait()
            await app.gateway.lanes.drain(30.0)
            await app.gateway.delivery.deliver_due()
            user_block = app.files.user(UserRef("cli", "ada")).load().render_block()
            sessions = await app.store.list_sessions("cli:dm:ada")
        searches = []
        search_calls = {
            b["id"]
            for req in emu.requests
            for m in req.body.get("messages", [])
            if m["role"] == "assistant" and isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_use" and b.get("name") == "session_search"
        }
        for req in emu.requests[-1:]:
            for m in req.body.get("messages", []):
                if m["role"] != "user" or not isinstance(m["content"], list):
                    continue
                for block in m["content"]:
                    if block.get("type") == "tool_result" and block.get("tool_use_id") in search_calls:
                        searches.append(block)
        usage = emu.total_usage()

    print(_rule("memory written (USER.md)"), file=out)
    print(user_block or "(nothing)", file=out)
    print(_rule("session_search"), file=out)
    shown = 0
    for block in searches:
        # The text the model read (memory/search_tool.py): the query, then the windows.
        content = block["content"]
        text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
        lines = [line for line in text.strip().splitlines() if line.strip()]
        for line in lines[:8]:
            print(f"  {line[:110]}", file=out)
        if len(lines) > 8:
            print(f"  … ({len(lines) - 8} more lines)", file=out)
        shown += 1
    if not shown:
        print("(no search was made)", file=out)
    print(_rule("tokens and cache"), file=out)
    prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    share = usage.cache_read_input_tokens / prompt if prompt else 0.0
    print(f"requests: {len(emu.requests)}, sessions: {len(sessions)}", file=out)
    print(
        f"prompt tokens: {prompt:,} — {usage.cache_read_input_tokens:,} read from cache ({share:.0%}), "
        f"{usage.cache_creation_input_tokens:,} written to cache; output tokens: {usage.output_tokens:,}",
        file=out,
    )
    print(
        f"(the emulator caches prefixes of ≥{DEMO_CACHE_MIN_TOKENS} tokens here for illustration; "
        "real models need 1,024+)",
        file=out,
    )
    return 0


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.home:
        from mnemo.profile_lock import hold

        with hold(settings.home):  # the demo runs a gateway on this profile
            return asyncio.run(_demo(settings, sys.stdout))
    with tempfile.TemporaryDirectory(prefix="mnemo-demo-") as tmp:
        demo_settings = load_settings(Path(tmp), environ={})
        return asyncio.run(_demo(demo_settings, sys.stdout))
