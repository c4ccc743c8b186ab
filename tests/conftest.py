"""Shared fixtures. Every test gets its own $MNEMO_HOME under tmp_path; nothing here
touches the network beyond 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.emulator import Emulator
from tests.support.cli import logging_restored, structlog_through_logging

# Shared, noisy CI machines: a per-example deadline turns a slow moment into a failure
# that says nothing about the code. Properties are checked; time is not.
hypothesis_settings.register_profile(
    "mnemo", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("mnemo")

# The throw-away PostgreSQL cluster (session fixture ``pg_cluster``), started only when
# a test asks for it: the contract suite's "postgresql" backend and the PostgreSQL e2e tests.
# Under pytest-xdist each worker is a session of its own, so each starts its own cluster.
pytest_plugins = ["tests.support.pgcluster"]

# The guard for a test marked slow (real processes, kill -9, replicas); every other test
# has pyproject's ``timeout``.
SLOW_TIMEOUT_S = 900


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests first (the order is otherwise kept), so a parallel run starts them at
    once instead of ending on one of them; and they get the longer guard."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


structlog_through_logging()  # what _logging_as_it_was restores after every test


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A test that runs ``mnemo.cli.main.main`` in this process lets it configure logging
    (root handler on that test's stderr, levels): undone after every test, so no later
    test logs into a closed capture stream or at another test's level."""
    with logging_restored():
        yield


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture
def settings(home: Path) -> Settings:
    # An empty environment: the host's variables never leak into a test.
    return load_settings(home, environ={})


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    """The Anthropic API emulator on 127.0.0.1, caching prefixes from 64 tokens so short
    test conversations exercise the prompt cache."""
    async with Emulator(min_cacheable_tokens=64) as emu:
        yield emu


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@dataclass(frozen=True)
class BackendUnderTest:
    name: str  # "sqlite" | "postgresql"
    url: str | None = None  # database.url (PostgreSQL)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, home: Path) -> BackendUnderTest:
    """Run a feature test on each backend: nothing configured (``state.db``), or
    ``database.url`` in ``home``'s config.yaml pointing at a fresh database of the
    throw-away cluster — so every process that opens ``home`` (the app, the CLI) uses it."""
    if request.param == "sqlite":
        return BackendUnderTest("sqlite")
    url = request.getfixturevalue("pg_cluster").fresh_database()
    (home / "config.yaml").write_text(f"database:\n  url: {url}\n", encoding="utf-8")
    return BackendUnderTest("postgresql", url)
