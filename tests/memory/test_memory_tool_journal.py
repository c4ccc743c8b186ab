"""The memory tool and the journal: provenance and trust of each write, the memory
policy applied where the write happens, the ``history`` action's scope, what a group
may see of a private profile, and the trust markers a prompt shows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mnemo.gateway.storage import state_database
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.journal import Actor, JournalQuery, Layer, Provenance, Trust, effective_trust, marked
from mnemo.memory.journal_sqlite import SqliteJournal
from mnemo.memory.memory_tool import MemoryCallContext, WriteAttempts, run_memory_tool
from mnemo.memory.policy import EffectivePolicy, Groups, History, Remember
from mnemo.memory.scope import AgentContext, UserRef

ANA = UserRef("telegram", "100")
BO = UserRef("telegram", "200")


@dataclass
class Memory:
    files: MemoryFiles
    journal: SqliteJournal


@pytest.fixture
async def mem(tmp_path: Path) -> AsyncIterator[Memory]:
    db = state_database(tmp_path / "state.db")
    await db.open()
    journal = SqliteJournal(db)
    try:
        yield Memory(MemoryFiles(tmp_path / "memories", journal=journal), journal)
    finally:
        await db.close()


def policy(
    remember: Remember = Remember.ON, groups: Groups = Groups.PRIVATE, chat: Remember = Remember.ON
) -> EffectivePolicy:
    return EffectivePolicy(remember, groups, chat, History.ON)


def ctx(
    context: AgentContext = AgentContext.PRIMARY,
    speaker: UserRef | None = ANA,
    *,
    pol: EffectivePolicy | None = None,
    group: bool = False,
    actor: str = Actor.MODEL,
) -> MemoryCallContext:
    return MemoryCallContext(
        speaker=speaker,
        agent_context=context,
        is_admin=False,
        policy=pol or policy(),
        is_group=group,
        session="s1",
        message="m9",
        chat="telegram:dm:100",
        tool_call="toolu_1",
        actor=actor,
    )


async def call(m: Memory, args: dict[str, Any], c: MemoryCallContext, **kw: Any) -> dict[str, Any]:
    return await run_memory_tool(
        m.files, args, c, WriteAttempts(), journal=m.journal, proposals=m.journal, **kw
    )


def add(content: str, *, stated: bool | None = None, target: str = "user") -> dict[str, Any]:
    args: dict[str, Any] = {"action": "add", "target": target, "content": content}
    if stated is not None:
        args["stated"] = stated
    return args


async def test_a_model_write_carries_its_turns_provenance_and_stated_only_when_said(mem: Memory) -> None:
    await call(mem, add("Ana is a nurse", stated=True), ctx())
    await call(mem, add("Ana seems to work nights"), ctx())
    inferred, stated = await mem.journal.history(JournalQuery())
    assert (stated.trust, inferred.trust) == ("stated", "inferred")
    assert (stated.actor, stated.speaker, stated.session, stated.message, stated.chat, stated.tool_call) == (
        "model",
        "telegram:100",
        "s1",
        "m9",
        "telegram:dm:100",
        "toolu_1",
    )


@pytest.mark.parametrize("context", [AgentContext.REVIEW, AgentContext.FLUSH])
async def test_a_background_pass_only_ever_infers(mem: Memory, context: AgentContext) -> None:
    await call(mem, add("Ana likes chess", stated=True), ctx(context))
    [entry] = await mem.journal.history(JournalQuery())
    assert (entry.trust, entry.actor) == ("inferred", f"job:{context}")
    await call(mem, add("Ana has a dog"), ctx())
    await call(mem, add("Ana has a dog", stated=True), ctx(context))  # a duplicate: nothing changes
    trusts = await mem.journal.trusts(Layer.CURATED, str(ANA), ["Ana has a dog"])
    assert trusts == {"Ana has a dog": Trust.INFERRED}, "the review never turns an inferred entry into stated"
    assert effective_trust(Trust.STATED, background=True) is Trust.INFERRED


async def test_an_operators_tool_writes_as_admin_and_mcp_is_an_actor(mem: Memory) -> None:
    await call(mem, add("Ana's desk is 4B"), ctx(actor=Actor.MCP))
    [entry] = await mem.journal.history(JournalQuery())
    assert (entry.actor, entry.trust) == ("mcp", "admin")


async def test_remember_off_refuses_every_write_of_a_person_or_a_chat(mem: Memory) -> None:
    for pol in (policy(remember=Remember.OFF), policy(chat=Remember.OFF)):
        out = await call(mem, add("Ana owns a boat", stated=True), ctx(pol=pol, group=True))
        assert out["success"] is False and "remember: off" in out["message"]
    assert (await asyncio.to_thread(mem.files.user(ANA).load)).entries == ()
    assert await mem.journal.history(JournalQuery()) == []


async def test_remember_ask_proposes_and_a_background_pass_cannot(mem: Memory) -> None:
    out = await call(mem, add("Ana likes jazz", stated=True), ctx(pol=policy(remember=Remember.ASK)))
    assert out["success"] is True and out["proposed"] is True and out["changed"] is False
    [proposal] = await mem.journal.proposals([str(ANA)])
    assert (proposal.id, proposal.new, proposal.trust, proposal.message) == (
        out["proposal"],
        "Ana likes jazz",
        "proposed",
        "m9",
    )
    assert (await asyncio.to_thread(mem.files.user(ANA).load)).entries == ()
    background = await call(
        mem, add("Ana likes jazz"), ctx(AgentContext.REVIEW, pol=policy(remember=Remember.ASK))
    )
    assert background["success"] is False and "confirm" in background["message"]
    assert len(await mem.journal.proposals([str(ANA)])) == 1


async def test_in_a_group_a_private_profile_never_comes_back_in_a_result(mem: Memory) -> None:
    for entry in ("Ana's PIN is in the drawer", "Ana's sister is Eva"):
        await call(mem, add(entry), ctx())
    miss = {"action": "remove", "target": "user", "old_text": "Ana"}  # ambiguous: matches both
    in_dm = await call(mem, miss, ctx())
    assert "matches" in in_dm
    in_group = await call(mem, miss, ctx(group=True))
    assert in_group["success"] is False and "matches" not in in_group and "entries" not in in_group
    assert "PIN" not in str(in_group)
    shared_profile = await call(mem, miss, ctx(group=True, pol=policy(groups=Groups.SHARED)))
    assert "matches" in shared_profile


async def test_the_history_action_gives_past_values_of_the_speakers_own_profile_only(mem: Memory) -> None:
    await call(mem, add("Ana prefers tea", stated=True), ctx())
    await call(
        mem,
        {"action": "replace", "target": "user", "old_text": "tea", "content": "Ana prefers coffee"},
        ctx(),
    )
    await call(mem, add("Bo prefers juice"), ctx(speaker=BO))
    out = await call(mem, {"action": "history", "target": "user"}, ctx())
    assert out["success"] is True and out["current"] == ["Ana prefers coffee"]
    values = {v["value"]: v for v in out["values"]}
    assert set(values) == {"Ana prefers tea", "Ana prefers coffee"}, "never another person's"
    assert values["Ana prefers tea"]["until"] == values["Ana prefers coffee"]["since"]
    assert values["Ana prefers coffee"]["until"] is None
    private = await call(mem, {"action": "history", "target": "user"}, ctx(group=True))
    assert private["success"] is False and "tea" not in str(private)
    nobody = await call(mem, {"action": "history", "target": "user"}, ctx(AgentContext.CRON, speaker=None))
    assert nobody["success"] is False


def test_the_prompt_marks_inferred_and_imported_entries_once() -> None:
    trusts = {"a": Trust.INFERRED, "b": Trust.IMPORTED, "c": Trust.STATED, "d": Trust.ADMIN}
    assert marked(["a", "b", "c", "d", "e"], trusts) == {"a": "(inferred) ", "b": "(imported) "}


async def test_a_snapshot_renders_the_markers_without_changing_its_usage(mem: Memory) -> None:
    profile = mem.files.user(ANA)
    await asyncio.to_thread(profile.add, "Ana is a nurse", Provenance(Actor.MODEL, Trust.INFERRED))
    await asyncio.to_thread(profile.add, "Ana lives in Lyon", Provenance(Actor.MODEL, Trust.STATED))
    snap = await asyncio.to_thread(profile.load)
    trusts = await mem.journal.trusts(Layer.CURATED, str(ANA), snap.entries)
    block = snap.render_block(marked(snap.entries, trusts))
    assert "(inferred) Ana is a nurse" in block and "\nAna lives in Lyon" in block
    assert block.splitlines()[1] == snap.render_block().splitlines()[1], (
        "the header counts the file, not markers"
    )
