"""The background skill review through the whole app: loopback adapter → gateway →
emulator (the real anthropic SDK), the persisted job queue, the skill store on disk.

The scripted model answers "do N things" with N tool calls (``skills_list``) and then a
reply; the review request (only ``skill_manage`` offered) is answered by a per-test hook.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mnemo.gateway.cron.service import Caller
from mnemo.gateway.cron.store import JobSource, JobTarget
from mnemo.gateway.emulator import RecordedRequest, Reply, ToolUse
from mnemo.gateway.events import ChatType
from mnemo.gateway.jobs.skill_review import SKILL_REVIEW
from mnemo.gateway.turns.prompt import CRON_HINT
from mnemo.memory.flush import BACKGROUND_TAG
from mnemo.memory.scope import UserRef
from mnemo.memory.skills import SkillStore
from tests.support.loopback import LoopbackAdapter

U1 = UserRef("loop", "u1")
MAIN = "claude-sonnet-4-6"  # the conversation's model: the review reads its cache
NO_LIMIT = {"access.rate_limit_per_minute": 0, "memory.nudge_interval": 0}


def skill_md(name: str, body: str = "1. Do the thing.\n") -> str:
    return f"---\nname: {name}\ndescription: How to {name}.\n---\n\n{body}"


def has_tool_results(request: RecordedRequest) -> bool:
    last = request.messages[-1]["content"]
    return isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)


def last_text(request: RecordedRequest) -> str:
    for message in reversed(request.messages):
        content = message["content"]
        if message["role"] != "user":
            continue
        if isinstance(content, str):
            return content
        texts = [b["text"] for b in content if b.get("type") == "text"]
        if texts:
            return "\n".join(texts)
    return ""


def is_review(request: RecordedRequest) -> bool:
    """Sent after the conversation itself, its instruction tagged in the last user turn."""
    text = last_text(request)
    return BACKGROUND_TAG in text and "keep its procedure as a skill" in text


ReviewHook = Callable[[RecordedRequest], Reply]


class World:
    """Chat turns: "do N things" → N tool calls in one response, then "done N".
    Review requests go to ``review`` (default: nothing to save)."""

    def __init__(self, review: ReviewHook | None = None) -> None:
        self.review = review or (lambda _r: Reply(text="Nothing to save."))
        self.reviews: list[RecordedRequest] = []
        self.chats: list[RecordedRequest] = []

    def __call__(self, request: RecordedRequest) -> Reply:
        if is_review(request):
            self.reviews.append(request)
            return self.review(request)
        self.chats.append(request)
        if has_tool_results(request):
            return Reply(text=f"done {len(request.messages[-1]['content'])}")
        if m := re.search(r"do (\d+) things", last_text(request)):
            return Reply(tool_uses=[ToolUse("skills_list", {"query": f"q{i}"}) for i in range(int(m[1]))])
        return Reply(text="ok")


async def settle(app: Any) -> None:
    await app.gateway.lanes.drain(30)
    await app.jobs.wait_idle()


async def turn(app: Any, adapter: LoopbackAdapter, text: str, n: int, user: str = "u1") -> None:
    await adapter.say(text, user=user)
    await adapter.wait_sent(n, timeout=30)
    await settle(app)


def create(name: str, body: str = "1. Do the thing.\n") -> Reply:
    return Reply(
        tool_uses=[
            ToolUse("skill_manage", {"action": "create", "name": name, "content": skill_md(name, body)})
        ]
    )


async def test_a_turn_with_five_tool_calls_enqueues_one_review_that_saves_a_user_skill(
    app_factory, emulator
) -> None:
    world = World(lambda _r: create("list-things", "1. Call skills_list per query.\n"))
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **NO_LIMIT) as app:
        await turn(app, adapter, "do 5 things", 1)
        (job,) = await app.jobs.jobs(kind=SKILL_REVIEW)
        assert job.state == "done"
        assert job.payload["tool_calls"] == 5
        assert job.checkpoint["reviewed"] is True and job.checkpoint["writes"] == 1
        assert job.checkpoint["reviewed_upto"] == job.payload["turn"]
        store = SkillStore(app.settings.skills_dir)
        assert [s.name for s in store.own(U1)] == ["list-things"] and store.shared() == []
        assert store.written_in_conversation(store.own(U1)[0]), "a later review may patch it"
        (review,) = world.reviews
        assert review.model == MAIN and "skill_manage" in review.tool_names
        chat = world.chats[-1]  # the turn's last request: the review repeats it, then asks
        assert (
            review.messages[: len(chat.messages)] == chat.messages or review.usage["cache_read_input_tokens"]
        )
        conversation = json.dumps(review.messages[:-1])
        assert "do 5 things" in conversation and conversation.count('"name": "skills_list"') == 5
        assert "done 5" in conversation
        assert "last 1 user turn(s)" in last_text(review) and "«do 5 things»" in last_text(review)
        # Nothing of the review reaches the user or the conversation.
        assert adapter.texts() == ["done 5"]
        session = await app.store.active_session("loop:dm:u1")
        rows = await app.store.load_messages(session.id)
        assert "skill_manage" not in json.dumps([r.content for r in rows])
        # Its cost is the user's, like the rest of their background work.
        spend = await app.budgets.ledger.spend(str(U1))
        assert spend.requests_today == len(emulator.requests) == 3, "two chat requests and the review"
        upkeep = await app.budgets.upkeep.spend(U1)  # and shown apart as upkeep
        assert [(k.kind, k.requests) for k in upkeep.kinds] == [("skill_review", 1)]


async def test_a_turn_with_fewer_tool_calls_or_none_enqueues_no_review(app_factory, emulator) -> None:
    emulator.default = World(lambda _r: create("never"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **NO_LIMIT) as app:
        await turn(app, adapter, "do 4 things", 1)
        await turn(app, adapter, "hello", 2)
        assert await app.jobs.jobs(kind=SKILL_REVIEW) == []
    async with app_factory(adapter, **NO_LIMIT, **{"skills.review_min_tool_calls": 2}) as app:
        await turn(app, adapter, "do 2 things", 3)
        (job,) = await app.jobs.jobs(kind=SKILL_REVIEW)
        assert job.payload["tool_calls"] == 2, "the threshold is the setting"


async def test_the_review_patches_the_users_skill_and_is_refused_every_shared_change(
    app_factory, emulator, home
) -> None:
    store = SkillStore(home / "skills")
    store.create(skill_md("team-deploy", "1. Ask ops.\n"), None)
    store.create(skill_md("my-flow", "1. Old step.\n"), U1, written_by="user")
    store.create(skill_md("given", "1. As installed.\n"), U1)  # `mnemo skills install --user`
    review = Reply(
        tool_uses=[
            ToolUse(
                "skill_manage",
                {"action": "patch", "name": "my-flow", "old_string": "Old step", "new_string": "New step"},
            ),
            ToolUse(
                "skill_manage",
                {"action": "patch", "name": "team-deploy", "old_string": "Ask ops", "new_string": "x"},
            ),
            ToolUse(
                "skill_manage",
                {"action": "edit", "name": "team-deploy", "content": skill_md("team-deploy", "x\n")},
            ),
            ToolUse("skill_manage", {"action": "delete", "name": "team-deploy"}),
            ToolUse("skill_manage", {"action": "delete", "name": "my-flow"}),
            ToolUse(
                "skill_manage",
                {"action": "create", "name": "team-deploy", "content": skill_md("team-deploy", "y\n")},
            ),
            ToolUse(
                "skill_manage",
                {"action": "patch", "name": "given", "old_string": "As installed", "new_string": "x"},
            ),
            ToolUse("memory", {"action": "add", "target": "user", "content": "not offered"}),
        ]
    )
    world = World(lambda _r: review)
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **NO_LIMIT) as app:
        await turn(app, adapter, "do 6 things", 1)
        (job,) = await app.jobs.jobs(kind=SKILL_REVIEW)
        assert job.state == "done" and job.checkpoint["writes"] == 1 and job.checkpoint["applied"] == 7
        refused = job.checkpoint["refused"]
        assert len(refused) == 6
        assert "not_found" in refused[0], "a shared skill is not among the user's"
        assert all("add_only" in r for r in refused[1:]), refused
    (prompt,) = [last_text(r) for r in world.reviews]
    assert "1. Old step." in prompt, "the user's skill text is shown, so it can be patched"
    assert "- team-deploy: How to team-deploy." in prompt and "- given: How to given." in prompt
    assert "1. As installed." not in prompt, "what it may not patch is listed by name only"
    assert store.read(store.find("my-flow", U1)) == skill_md("my-flow", "1. New step.\n")
    assert store.read(store.find("given", U1)) == skill_md("given", "1. As installed.\n")
    assert [s.name for s in store.own(U1)] == ["given", "my-flow"]
    assert store.read(store.shared()[0]) == skill_md("team-deploy", "1. Ask ops.\n")
    assert not (home / "memories" / "users" / "loop" / "u1" / "USER.md").exists()


async def test_an_admins_review_writes_only_the_admins_own_skills(app_factory, emulator) -> None:
    emulator.default = World(lambda _r: create("admin-trick"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **NO_LIMIT) as app:
        await turn(app, adapter, "do 5 things", 1, user="admin")
        store = SkillStore(app.settings.skills_dir)
        assert store.shared() == []
        assert [s.name for s in store.own(UserRef("loop", "admin"))] == ["admin-trick"]


def inbox_unfinished(home: Path) -> None:
    """What a crash after the reply, before the inbox row was marked done, leaves."""
    with sqlite3.connect(home / "state.db") as db:
        db.execute("UPDATE inbox SET state = 'processing'")


async def test_a_review_runs_once_across_a_second_job_a_restart_and_a_replayed_turn(
    app_factory, emulator, home
) -> None:
    world = World(lambda _r: create("once"))
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **NO_LIMIT) as app:
        await turn(app, adapter, "do 5 things", 1)
        (first,) = await app.jobs.jobs(kind=SKILL_REVIEW)
        # A second job for the same session (a duplicate enqueue) finds nothing new.
        await app.jobs.enqueue(SKILL_REVIEW, first.session_id, first.payload)
        await settle(app)
        jobs = await app.jobs.jobs(kind=SKILL_REVIEW)
        assert [j.state for j in jobs] == ["done", "done"]
        assert jobs[1].checkpoint == {
            "reviewed": True,
            "reviewed_from": first.payload["turn"],
            "reviewed_upto": first.payload["turn"],
            "writes": 0,
            "after_user": jobs[0].checkpoint["after_user"],  # the repeat guard's mark
        }
    assert len(world.reviews) == 1
    inbox_unfinished(home)
    async with app_factory(adapter, **NO_LIMIT) as app:
        await settle(app)
        await asyncio.sleep(0)  # the replayed turn's listener has run once the lane drained
        assert len(await app.jobs.jobs(kind=SKILL_REVIEW)) == 2, "the replayed turn was reviewed already"
    assert len(world.reviews) == 1
    assert [s.name for s in SkillStore(home / "skills").own(U1)] == ["once"]


@pytest.mark.slow
async def test_a_turn_replayed_after_a_crash_before_its_review_was_queued_gets_one(
    app_factory, emulator, home
) -> None:
    world = World(lambda _r: create("late"))
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **NO_LIMIT) as app:
        await turn(app, adapter, "do 5 things", 1)
    with sqlite3.connect(home / "state.db") as db:
        db.execute("DELETE FROM jobs")  # the crash came before the enqueue
    inbox_unfinished(home)
    world.reviews.clear()
    async with app_factory(adapter, **NO_LIMIT) as app:
        await settle(app)
        (job,) = await app.jobs.jobs(kind=SKILL_REVIEW)
        assert job.state == "done" and job.checkpoint["writes"] == 0, "the skill exists: create is refused"
    assert len(world.reviews) == 1, "the replay asked the model nothing, the review once"


async def test_a_cron_run_with_many_tool_calls_enqueues_no_review(app_factory, emulator) -> None:
    def responder(request: RecordedRequest) -> Reply:
        if CRON_HINT in request.system_text and not has_tool_results(request):
            return Reply(tool_uses=[ToolUse("skills_list", {"query": f"q{i}"}) for i in range(6)])
        return Reply(text="checked")

    emulator.default = responder
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **NO_LIMIT) as app:
        caller = Caller(JobSource.COMMAND, JobTarget("loop", "u1", ChatType.DM), "u1")
        await app.cron.create(caller, kind="in", when="1s", prompt="Check the skills.")
        (sent,) = await adapter.wait_sent(1, timeout=30)
        assert sent.scheduled and sent.text == "checked"
        await settle(app)
        assert await app.jobs.jobs(kind=SKILL_REVIEW) == []
        assert len(emulator.requests) == 2
