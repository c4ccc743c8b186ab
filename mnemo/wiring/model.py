"""The LLM client, and in trial mode the scripted emulator it talks to. The client asks
``gate`` (the budget gate) before every request."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass

from mnemo.gateway.budgets.charge import RequestGate
from mnemo.gateway.config import Settings
from mnemo.gateway.llm.client import LLMClient
from mnemo.gateway.logs import get_logger
from mnemo.gateway.metrics import Metrics

log = get_logger(__name__)


@dataclass(frozen=True)
class Model:
    llm: LLMClient
    # The in-process scripted model (``gateway/emulator``) in trial mode; else None.
    emulator: object | None


async def open_model(
    stack: AsyncExitStack,
    settings: Settings,
    metrics: Metrics,
    *,
    gate: RequestGate,
    trial: bool,
    base_url: str | None,
    api_key: str | None,
) -> Model:
    emulator = None
    if trial:
        # The emulator stays off the runtime path: imported only here and in the demo.
        from mnemo.gateway.emulator import Emulator

        emulator = Emulator(record_limit=100)
        await emulator.start()
        stack.push_async_callback(emulator.stop)
        base_url = emulator.base_url
        api_key = api_key or "trial-mode"
        log.info("trial_mode")  # the command prints TRIAL_BANNER once, on stderr
    # Scripted replies cost nothing: priced at zero, /status, /usage and the ledger agree.
    llm_settings = settings.llm.model_copy(update={"prices": {}}) if trial else settings.llm
    llm = LLMClient(llm_settings, gate=gate, base_url=base_url, api_key=api_key, metrics=metrics)
    stack.push_async_callback(llm.aclose)
    return Model(llm, emulator)
