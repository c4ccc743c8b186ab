"""Media history bound: prompt tokens and cost of a 40-turn chat with 10 images, with and
without ``media.history_images``, in the same run.

    python bench/media_history.py [--turns 40] [--images 10] [--side 1024] [--model claude-sonnet-4-6]

Both runs are the same conversation through the whole bot — python-telegram-bot inside
``TelegramAdapter`` against the fake Bot API (photos downloaded with getFile), the
gateway, and the real ``anthropic`` SDK against the local emulator, which counts image
tokens as the API does (width × height / 750) and accounts prompt caching:

* **bounded** — ``media.history_images: 3`` (the default): older image turns are re-sent
  as a one-line placeholder;
* **unbounded** — ``media.history_images`` at least the number of images: every image
  is re-sent with every later request.

Prints, for each: prompt tokens (cache read, cache write, uncached), image blocks sent,
the largest request's prompt size, and the estimated cost; then the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnemo.gateway.emulator import Emulator, Reply
from mnemo.gateway.llm.client import Usage, cost_usd
from mnemo.gateway.logs import configure_logging
from tests.adapters.telegram_harness import TelegramRig
from tests.fakes.telegram_api import FakeTelegram
from tests.fakes.telegram_world import jpeg

CHAT = USER = 4711
TOPICS = ["the garden", "a bike repair", "the kitchen shelf", "a hiking trail", "the cat's new bed"]


@dataclass(frozen=True)
class Result:
    usage: Usage
    cost: float
    image_blocks: int
    last_prompt: int  # the largest request (the last turn's)


def reply_text(turn: int) -> str:
    topic = TOPICS[turn % len(TOPICS)]
    return f"About {topic}: " + " ".join(f"point {i + 1}, try it for a week and compare." for i in range(4))


def prompt_tokens(usage: dict | None) -> int:
    u = usage or {}
    return sum(
        int(u.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )


async def run(history_images: int, turns: int, images: int, side: int, model: str) -> Result:
    every = max(1, turns // images)
    image_turns = set(range(0, every * images, every))
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        async with Emulator() as emu, FakeTelegram(bot_username="mnemo_bench_bot") as fake:
            n = {"turn": 0}
            emu.default = lambda _: Reply(text=reply_text(n["turn"]))
            rig = TelegramRig(fake, emu, home)
            overrides = {"media.history_images": history_images, "llm.model": model}
            async with rig.app(**overrides) as (app, _):
                for turn in range(turns):
                    n["turn"] = turn
                    if turn in image_turns:
                        colour = (turn * 23 % 255, 90, 160)
                        content = jpeg(side, side * 3 // 4, colour)
                        fake.push_image(CHAT, USER, content, width=side, height=side * 3 // 4,
                                        caption=f"turn {turn}: what do you think of this photo of"
                                                f" {TOPICS[turn % 5]}?")  # fmt: skip
                    else:
                        fake.push_text(
                            CHAT, USER, f"turn {turn}: tell me more about {TOPICS[turn % 5]}, briefly."
                        )
                    await fake.wait_for_sent(turn + 1, timeout=60)
                settings = app.settings
            chats = [r for r in emu.requests if r.usage is not None and r.body and r.body.get("tools")]
            u = emu.total_usage()
            usage = Usage(
                u.input_tokens, u.output_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens
            )
            blocks = sum(
                1 for r in chats for m in r.body["messages"] if isinstance(m["content"], list)
                for b in m["content"] if b.get("type") == "image"
            )  # fmt: skip
            return Result(
                usage,
                cost_usd(settings.llm.prices, model, usage),
                blocks,
                max(prompt_tokens(r.usage) for r in chats),
            )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--images", type=int, default=10)
    ap.add_argument("--side", type=int, default=1024, help="width of each photo in px (height 3/4 of it)")
    ap.add_argument("--model", default="claude-sonnet-4-6")
    args = ap.parse_args()
    configure_logging("error", "console")
    bounded = await run(3, args.turns, args.images, args.side, args.model)
    unbounded = await run(max(args.images, 3), args.turns, args.images, args.side, args.model)
    side = f"{args.side}x{args.side * 3 // 4}"
    print(f"{args.turns}-turn chat with {args.images} images ({side}), model {args.model}")
    print(f"{'':11}{'prompt tok':>12}{'cache read':>12}{'cache write':>12}{'uncached':>10}{'images sent':>13}"
          f"{'max prompt':>13}{'cost $':>9}")  # fmt: skip
    for name, r in (("bounded", bounded), ("unbounded", unbounded)):
        u = r.usage
        print(f"{name:11}{u.prompt_tokens:>12,}{u.cache_read_tokens:>12,}{u.cache_write_tokens:>12,}{u.input_tokens:>10,}"
              f"{r.image_blocks:>13,}{r.last_prompt:>13,}{r.cost:>9.3f}")  # fmt: skip
    print(f"prompt tokens bounded/unbounded: {bounded.usage.prompt_tokens / unbounded.usage.prompt_tokens:.2f}; "
          f"cost: {bounded.cost / unbounded.cost:.2f}; largest request:"
          f" {bounded.last_prompt / unbounded.last_prompt:.2f}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
