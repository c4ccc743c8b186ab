"""``mnemo doctor``'s provider lines against the fake Mem0 API (and a closed port): the
configured provider, reachable or not within the per-check deadline, the last error the
gateway recorded, and the queued/failed writes of the job queue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mnemo.cli.doctor import Check, Status, run_checks
from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.jobs.store import JobState
from mnemo.gateway.storage import open_backend
from mnemo.memory.durable import ProviderHealth
from mnemo.memory.provider_config import provider_dir
from mnemo.providers.hindsight import HindsightProvider
from mnemo.providers.mem0 import Mem0Provider
from tests.adapters.telegram_harness import free_port
from tests.fakes.mem0_api import FakeMem0
from tests.support.cli import run_mnemo

KEY = "m0-doctor-secret-key"


@pytest.fixture
async def fake() -> AsyncIterator[FakeMem0]:
    f = FakeMem0(KEY)
    await f.start()
    yield f
    await f.stop()


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def mem0_settings(home: Path, base_url: str) -> Settings:
    Mem0Provider().save_config({"api_key": KEY, "base_url": base_url}, home)
    (home / "config.yaml").write_text("memory:\n  provider: mem0\n")
    return load_settings(home, environ={"MNEMO_WEB_PORT": "0"})


async def add_writes(settings: Settings, *, queued: int, failed: int, done: int, error: str) -> None:
    """provider_write jobs in the real job table, moved through the repository as the
    queue moves them."""
    backend = await open_backend(settings)
    try:
        n = 0
        for state, count in ((JobState.QUEUED, queued), (JobState.FAILED, failed), (JobState.DONE, done)):
            for _ in range(count):
                n += 1
                job, created = await backend.jobs.add(
                    "provider_write",
                    f"s{n}",
                    {"provider": "mem0", "payload": {"key": f"turn-{n}"}},
                    cooldown_s=0,
                    now=1.0,
                )
                assert created
                await backend.jobs.claim(["provider_write"], now=2.0)
                await backend.jobs.settle(
                    job.id, state, now=3.0, error=None if state is JobState.DONE else error, not_before=3.0
                )
    finally:
        await backend.close()


async def test_no_provider_configured_means_no_provider_lines(home: Path) -> None:
    names = [c.name for c in await run_checks(load_settings(home, environ={"MNEMO_WEB_PORT": "0"}))]
    assert "provider" not in names and "provider writes" not in names


async def test_a_reachable_provider_with_queued_and_failed_writes(home: Path, fake: FakeMem0) -> None:
    settings = mem0_settings(home, fake.base_url)
    ProviderHealth(provider_dir(home, "mem0")).failed("ConnectError: mem0 refused the connection")
    await add_writes(settings, queued=2, failed=1, done=3, error="HTTPStatusError: 503 Service Unavailable")
    checks = await run_checks(settings)
    assert [c.name for c in checks][-2:] == ["provider", "provider writes"]
    got = by_name(checks)
    provider = got["provider"]
    assert provider.status is Status.PASS, provider
    assert f"mem0 at {fake.base_url} is reachable" in provider.detail
    assert "the gateway's last error: ConnectError: mem0 refused the connection" in provider.detail
    assert [(r.method, r.path) for r in fake.requests] == [("GET", "/")]  # the probe, nothing written
    assert KEY not in str(fake.requests[0].headers)
    writes = got["provider writes"]
    assert writes.status is Status.FAIL, writes
    assert writes.detail.startswith("2 queued, 1 failed, 3 done; last error: HTTPStatusError: 503")


async def test_only_queued_writes_pass_with_the_error_they_wait_on(home: Path, fake: FakeMem0) -> None:
    settings = mem0_settings(home, fake.base_url)
    await add_writes(settings, queued=3, failed=0, done=0, error="RetryLater: mem0 answered 429")
    writes = by_name(await run_checks(settings))["provider writes"]
    assert writes.status is Status.PASS
    assert (
        writes.detail
        == "3 queued, 0 failed, 0 done (waiting to be retried; last error: RetryLater: mem0 answered 429)"
    )


async def test_a_provider_answering_503_fails(home: Path, fake: FakeMem0) -> None:
    fake.down = True
    got = by_name(await run_checks(mem0_settings(home, fake.base_url)))
    assert got["provider"].status is Status.FAIL
    assert got["provider"].detail == f"mem0 at {fake.base_url} answers HTTP 503 (down)"
    assert (
        got["provider writes"].status is Status.PASS
        and got["provider writes"].detail == "0 queued, 0 failed, 0 done"
    )


async def test_a_closed_port_is_unreachable(home: Path) -> None:
    base = f"http://127.0.0.1:{free_port()}"
    provider = by_name(await run_checks(mem0_settings(home, base)))["provider"]
    assert provider.status is Status.FAIL and provider.detail.startswith(f"mem0 at {base} unreachable:")


async def test_a_hanging_provider_fails_within_the_checks_deadline(home: Path, fake: FakeMem0) -> None:
    fake.hold()
    try:
        checks = await asyncio.wait_for(run_checks(mem0_settings(home, fake.base_url), timeout_s=0.5), 30)
    finally:
        fake.release()
    provider = by_name(checks)["provider"]
    assert provider.status is Status.FAIL and provider.detail == "unreachable: no answer within 0.5 s"


async def test_a_configured_but_unavailable_provider_fails_with_the_reason(home: Path, monkeypatch) -> None:
    monkeypatch.delenv("HINDSIGHT_BASE_URL", raising=False)
    HindsightProvider().save_config({"api_key": "hs-x"}, home)
    (home / "config.yaml").write_text("memory:\n  provider: hindsight\n")
    provider = by_name(await run_checks(load_settings(home, environ={"MNEMO_WEB_PORT": "0"})))["provider"]
    assert provider.status is Status.FAIL
    assert provider.detail.startswith(
        "hindsight is configured (memory.provider) but unavailable: set base_url"
    )


async def test_the_command_prints_the_provider_lines_without_the_key(home: Path, fake: FakeMem0) -> None:
    home.chmod(0o700)
    mem0_settings(home, fake.base_url)
    health = ProviderHealth(provider_dir(home, "mem0"))
    health.failed(f"HTTPError: 401 for key {KEY}")  # an error that quotes the key
    # On a thread: the fake answers from this test's event loop meanwhile.
    p = await asyncio.to_thread(run_mnemo, None, "--home", str(home), "doctor", MNEMO_WEB_PORT="0")
    lines = {line.split(":", 1)[0]: line for line in p.stdout.splitlines() if ":" in line}
    assert lines["✓ provider"].startswith(f"✓ provider: mem0 at {fake.base_url} is reachable"), p.stdout
    assert "HTTPError: 401 for key ***" in lines["✓ provider"]
    assert lines["✓ provider writes"] == "✓ provider writes: 0 queued, 0 failed, 0 done"
    assert KEY not in p.stdout + p.stderr
