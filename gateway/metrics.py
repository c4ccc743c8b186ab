"""Prometheus metrics, one registry per application (tests run several in a process).

Who records what:
* the gateway: messages in/out per platform, turn errors, refusals;
* the LLM client: request latency, tokens by kind (input, output, cache_read,
  cache_write), errors by type;
* the lanes: how long each turn waited for a slot (``gateway.max_concurrent_turns``);
* queue depths (lanes, turns waiting for a slot, outbox, worker) and the turns
  running are read when ``/metrics`` is scraped.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.messages_in = Counter("mnemo_messages_in", "Inbound messages accepted", ["platform"], registry=r)
        self.messages_out = Counter("mnemo_messages_out", "Replies delivered", ["platform"], registry=r)
        self.refused = Counter(
            "mnemo_messages_refused", "Inbound messages refused by access control", registry=r
        )
        self.errors = Counter("mnemo_errors", "Errors by kind", ["kind"], registry=r)
        self.llm_latency = Histogram(
            "mnemo_llm_latency_seconds",
            "LLM request latency including retries",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.tokens = Counter("mnemo_llm_tokens", "LLM tokens by kind", ["kind"], registry=r)
        self.cache_hit_ratio = Gauge(
            "mnemo_cache_hit_ratio",
            "Share of prompt tokens read from the prompt cache (process lifetime)",
            registry=r,
        )
        self.queue_depth = Gauge("mnemo_queue_depth", "Work waiting, by queue", ["queue"], registry=r)
        self.turns_running = Gauge("mnemo_turns_running", "Turns holding a slot", registry=r)
        self.turn_wait = Histogram(
            "mnemo_turn_wait_seconds",
            "How long a turn waited for a slot (gateway.max_concurrent_turns)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=r,
        )
        # Pre-create the label values so every series is scraped from the start (a whole
        # prompt read from cache would otherwise leave "input" missing, not zero).
        for kind in ("input", "output", "cache_read", "cache_write"):
            self.tokens.labels(kind)
        for queue in ("lanes", "turns", "outbox", "jobs"):
            self.queue_depth.labels(queue)
        self._prompt_tokens = 0
        self._cache_read = 0
        self._collectors: list[Callable[[], Awaitable[None] | None]] = []

    def observe_llm(
        self, latency_s: float, input_tokens: int, output_tokens: int, cache_read: int, cache_write: int
    ) -> None:
        self.llm_latency.observe(latency_s)
        for kind, n in (
            ("input", input_tokens),
            ("output", output_tokens),
            ("cache_read", cache_read),
            ("cache_write", cache_write),
        ):
            if n:
                self.tokens.labels(kind).inc(n)
        self._prompt_tokens += input_tokens + cache_read + cache_write
        self._cache_read += cache_read
        if self._prompt_tokens:
            self.cache_hit_ratio.set(self._cache_read / self._prompt_tokens)

    def on_scrape(self, collect: Callable[[], Awaitable[None] | None]) -> None:
        """Register a callback (sync or async) that refreshes gauges right before a scrape."""
        self._collectors.append(collect)

    async def render(self) -> bytes:
        for collect in self._collectors:
            pending = collect()
            if inspect.isawaitable(pending):
                await pending
        return generate_latest(self.registry)
