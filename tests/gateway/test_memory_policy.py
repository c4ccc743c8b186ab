"""Memory policies in the pipeline (loopback adapter, emulator): a profile reaches a
group only in its own person's turn and only when shared, a DM prompt marks inferred
entries, and a ``history: off`` chat carries nothing from one turn to the next."""

from __future__ import annotations

import asyncio
import json

from mnemo.gateway.emulator import Reply
from mnemo.gateway.events import ChatType
from mnemo.memory.journal import Actor, Provenance, Trust
from mnemo.memory.policy import History
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from tests.gateway.test_slash_commands import converse
from tests.support.loopback import LoopbackAdapter

U1, U2 = UserRef("loop", "u1"), UserRef("loop", "u2")
GROUP = {"chat": "g1", "chat_type": ChatType.GROUP}


def seen(request: object) -> tuple[str, str]:
    """(the system prompt, the messages) of a recorded request, as text."""
    body = getattr(request, "body", None) or {}
    return json.dumps(body.get("system"), ensure_ascii=False), json.dumps(
        body.get("messages"), ensure_ascii=False
    )


async def test_a_profile_reaches_a_group_only_in_its_persons_own_turn_and_only_when_shared(
    app_factory, emulator
) -> None:
    emulator.default = lambda _: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await asyncio.to_thread(app.files.user(U1).add, "U1-marker likes tea")
        await asyncio.to_thread(app.files.user(U2).add, "U2-marker likes coffee")
        [answer] = await converse(adapter, emulator, "/memory policy groups shared", user="u1")
        assert "groups: shared" in answer
        asked = len(emulator.requests)
        await converse(adapter, emulator, "hello from one", user="u1", **GROUP)
        await converse(adapter, emulator, "hello from two", user="u2", **GROUP)
        one, two = emulator.requests[asked:]
    system, messages = seen(one)
    assert "U1-marker" not in system, "never in a group's system prompt"
    assert "U1-marker" in messages and "<memory-context>" in messages, "in u1's own turn, fenced"
    assert "U2-marker" not in system + messages, "u2 keeps the default: private"
    system, messages = seen(two)
    assert "U1-marker" not in system + messages and "U2-marker" not in system + messages


async def test_a_dm_prompt_marks_what_the_journal_knows_as_inferred(app_factory, emulator) -> None:
    emulator.default = lambda _: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        profile = app.files.user(U1)
        await asyncio.to_thread(
            profile.add, "u1 seems to be a night owl", Provenance(Actor.MODEL, Trust.INFERRED)
        )
        await asyncio.to_thread(profile.add, "u1 lives in Lyon", Provenance(Actor.MODEL, Trust.STATED))
        await converse(adapter, emulator, "hi", user="u1")
    system, _ = seen(emulator.requests[-1])
    assert "(inferred) u1 seems to be a night owl" in system
    assert "(inferred) u1 lives in Lyon" not in system and "u1 lives in Lyon" in system


async def test_a_history_off_chat_keeps_no_messages_from_one_turn_to_the_next(app_factory, emulator) -> None:
    emulator.default = lambda _: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        assert app.policies is not None
        await app.policies.repo.set_chat("loop:g1", history=History.OFF, by="test")
        await converse(adapter, emulator, "first-secret-5521", user="u1", **GROUP)
        await converse(adapter, emulator, "second", user="u1", **GROUP)
        _, messages = seen(emulator.requests[-1])
        sessions = await app.store.list_sessions(None)
        left = [m for s in sessions for m in await app.store.load_messages(s.id)]
        found = await app.search.search(
            "first-secret-5521", chat_keys=[s.chat_key for s in sessions], limit=5
        )
    assert "first-secret-5521" not in messages, "the second turn starts from nothing"
    assert left == [] and all(s.is_ended for s in sessions)
    assert not found.sessions


def test_a_provider_writes_only_when_the_policy_lets_the_turn_store(tmp_path) -> None:
    ctx = ProviderContext("s", "loop:dm:u1", "loop", U1, AgentContext.PRIMARY, tmp_path)
    assert ctx.may_write
    assert not ProviderContext(
        "s", "loop:dm:u1", "loop", U1, AgentContext.PRIMARY, tmp_path, remember=False
    ).may_write
