"""The MCP tests' shared pieces: the configuration of the stdio test server
(``tests/support/mcp_server.py``, written with the official SDK) and request readers."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from mnemo.app import open_app
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, RecordedRequest
from tests.support.loopback import LoopbackAdapter

ROOT = Path(__file__).resolve().parents[2]


def server_config(log: Path | None = None, **settings: Any) -> dict[str, Any]:
    """``mcp.servers.NAME`` for the test server; ``log`` records every call it gets."""
    env = {"PYTHONPATH": str(ROOT)}
    if log is not None:
        env["MCP_TEST_LOG"] = str(log)
    return {"command": sys.executable, "args": ["-m", "tests.support.mcp_server"], "env": env, **settings}


def server_calls(log: Path) -> list[dict[str, Any]]:
    """The calls the test server received (one JSON line each)."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def tool_results(request: RecordedRequest) -> list[dict[str, Any]]:
    """The tool_result blocks of a request's newest user turn."""
    content = request.messages[-1]["content"] if request.messages else ""
    return (
        [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        if isinstance(content, list)
        else []
    )


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content or "")


BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def database(request: pytest.FixtureRequest) -> dict[str, str]:
    """Settings overrides for one backend: nothing (SQLite) or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return {}
    cluster = request.getfixturevalue("pg_cluster")
    return {"database.url": cluster.fresh_database()}


def clean_environ() -> dict[str, str]:
    """This process's environment without any mnemo, Anthropic or platform setting."""
    prefixes = ("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def env_for(database: dict[str, str], **extra: str) -> dict[str, str]:
    """The environment of a ``mnemo`` subprocess on that backend."""
    env = {"PYTHONPATH": str(ROOT), **extra}
    if "database.url" in database:
        env["MNEMO_DATABASE_URL"] = database["database.url"]
    return env


def telegram_app(home: Path, emulator: Emulator, adapter: LoopbackAdapter, **overrides: Any) -> Any:
    """``open_app`` with a loopback adapter standing in for Telegram (users telegram:ID)."""
    base = {
        "access.allowed": ("telegram:*",),
        "access.admins": ("telegram:1",),
        "access.rate_limit_per_minute": 0,
        "llm.max_retries": 1,
        "llm.retry_after_cap_s": 0.05,
        "streaming.enabled": False,
        **overrides,
    }
    settings = load_settings(home, environ={}, overrides=base)
    return open_app(
        settings, adapters=[adapter], llm_base_url=emulator.base_url, api_key="test-key", trial=False
    )


async def mnemo(home: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``python -m mnemo --home HOME ARGS`` as a real process: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mnemo",
        "--home",
        str(home),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**clean_environ(), **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()
