from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from mnemo.app import App, open_app
from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.emulator import Emulator
from tests.support.loopback import LoopbackAdapter


def make_settings(home: Path, **overrides: Any) -> Settings:
    base = {
        "access.admins": ("loop:admin",),
        "access.allowed": ("loop:*",),
        "llm.max_retries": 2,
        "llm.retry_after_cap_s": 0.05,
    }
    base.update(overrides)
    return load_settings(home, environ={}, overrides=base)


AppFactory = Callable[..., AbstractAsyncContextManager[App]]


@pytest.fixture
def app_factory(home: Path, emulator: Emulator) -> AppFactory:
    """open_app against the emulator with a loopback adapter; loop users are allowlisted."""

    def factory(adapter: LoopbackAdapter | None = None, **overrides: Any) -> AbstractAsyncContextManager[App]:
        settings = make_settings(home, **overrides)
        return open_app(
            settings,
            adapters=[adapter or LoopbackAdapter()],
            llm_base_url=emulator.base_url,
            api_key="test-key",
            trial=False,
        )

    return factory
