"""A turn reads its session's history once and keeps it: what it stores is appended to
the history it loaded, exactly as a fresh read would return it (SQLite and PostgreSQL),
and tool rounds add only their writes — counted with the Database's round-trip hook."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from mnemo.gateway.budgets.charge import UNMETERED
from mnemo.gateway.config import LLMSettings, MemorySettings, SessionSettings
from mnemo.gateway.emulator import Emulator, Reply, ToolUse
from mnemo.gateway.llm.client import LLMClient
from mnemo.gateway.storage import state_database
from mnemo.gateway.turns.agent import Agent, AgentDeps, TurnInput
from mnemo.gateway.turns.tools import Tool, ToolRegistry, TurnContext
from mnemo.memory.scope import AgentContext
from mnemo.memory.sessions import MessageRow, SessionStore
from tests.contract.conftest import BACKENDS

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    if request.param == "sqlite":
        db = state_database(tmp_path / "state.db")
        await db.open()
        yield SessionStore(db), db
        await db.close()
        return
    from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
    from mnemo.memory.pg.db import PgDatabase
    from mnemo.memory.pg.sessions import PgSessionStore

    pg = PgDatabase(
        request.getfixturevalue("pg_cluster").fresh_database(), migrations=PG_MIGRATIONS, max_size=2
    )
    await pg.open()
    yield PgSessionStore(pg), pg
    await pg.close()


async def _lookup(args: Any, ctx: TurnContext) -> dict[str, Any]:
    return {"found": args["q"].upper(), "nested": {"list": (1, 2)}}


def _registry() -> ToolRegistry:
    tools = ToolRegistry()
    tools.register(
        Tool(
            "lookup",
            {
                "name": "lookup",
                "description": "look a word up",
                "input_schema": {
                    "type": "object",
                    "properties": {"q": {"type": "string"}},
                    "required": ["q"],
                },
            },
            _lookup,
        )
    )
    return tools


def _comparable(rows: list[MessageRow]) -> list[MessageRow]:
    """Rows but their time (the turn's clock and the store's differ by moments)."""
    return [dataclasses.replace(r, created_at=EPOCH) for r in rows]


async def test_a_turn_keeps_the_history_it_loaded(store: tuple[Any, Any], emulator: Emulator) -> None:
    sessions, db = store
    emulator.script(
        Reply(text="first answer"),
        Reply(tool_uses=[ToolUse("lookup", {"q": "héllo"}), ToolUse("lookup", {"q": "b"})]),
        Reply(tool_uses=[ToolUse("lookup", {"q": "c"})]),
        Reply(text="done — ünïcode"),
    )
    async with LLMClient(
        LLMSettings(max_retries=0), gate=UNMETERED, base_url=emulator.base_url, api_key="k"
    ) as llm:
        deps = AgentDeps(llm, sessions, _registry(), SessionSettings(), MemorySettings())
        session = await sessions.create_session(
            chat_key="loop:dm:u1", platform="loop", chat_id="u1", thread_id=None, user_id="u1",
            agent_context="primary", source="chat", model="m", system_prompt="You help.",
        )  # fmt: skip
        ctx = TurnContext(
            session.id, "loop:dm:u1", "loop", "u1", None, "Ada", AgentContext.PRIMARY, False, True
        )

        async def turn(text: str, message_id: str) -> tuple[Agent, int]:
            agent = await Agent.load(deps, session, ctx)
            before = db.round_trips
            await agent.run(
                TurnInput(text=text, author_id="u1", author_name="Ada", platform_message_id=message_id)
            )
            return agent, db.round_trips - before

        plain, plain_trips = await turn("hi", "m1")
        assert _comparable(plain.history) == _comparable(await sessions.load_messages(session.id))
        # The user's message; the reply with its usage: two writes, no read.
        assert plain_trips == 2

        tools, tool_trips = await turn("look things up", "m2")
        stored = await sessions.load_messages(session.id)
        assert [r.role for r in stored[2:]] == [
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "tool",
            "assistant",
        ]
        assert _comparable(tools.history) == _comparable(stored)
        # Two tool rounds: per round its assistant row with its usage, then its results; no read.
        assert tool_trips == plain_trips + 2 * 2
