"""The skill tools' write rules and the index in the system prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mnemo.gateway.turns.prompt import PromptParts, render_system_prompt
from mnemo.gateway.turns.skill_tools import skill_tools
from mnemo.gateway.turns.tools import ToolRegistry, TurnContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.skills import SkillStore
from mnemo.memory.skills.index import render_index

ALICE = UserRef("telegram", "1")


def skill_md(name: str, body: str = "steps\n") -> str:
    return f"---\nname: {name}\ndescription: About {name}.\n---\n\n{body}"


def ctx(
    agent: AgentContext = AgentContext.PRIMARY, *, admin: bool = False, speaker: UserRef | None = ALICE
) -> TurnContext:
    return TurnContext(
        session_id="s",
        chat_key="k",
        platform="telegram",
        chat_id="1",
        speaker=speaker,
        speaker_name="A",
        agent_context=agent,
        is_admin=admin,
        is_dm=True,
    )


@pytest.fixture
def setup(tmp_path: Path) -> tuple[ToolRegistry, SkillStore]:
    store = SkillStore(tmp_path / "skills")
    registry = ToolRegistry()
    for tool in skill_tools(store):
        registry.register(tool)
    return registry, store


async def call(registry: ToolRegistry, c: TurnContext, **args: str) -> dict:
    return json.loads((await registry.call("skill_manage", args, c)).content)


async def test_admin_writes_shared_user_writes_own(setup: tuple[ToolRegistry, SkillStore]) -> None:
    registry, store = setup
    assert (await call(registry, ctx(admin=True), action="create", name="team", content=skill_md("team")))[
        "success"
    ]
    assert (await call(registry, ctx(), action="create", name="mine", content=skill_md("mine")))["success"]
    assert [s.name for s in store.shared()] == ["team"]
    assert [s.name for s in store.own(ALICE)] == ["mine"]
    # A non-admin cannot touch the shared skill: it is not among theirs.
    out = await call(registry, ctx(), action="delete", name="team")
    assert out["success"] is False and "not_found" in out["error"]
    out = await call(registry, ctx(), action="create", name="other", content=skill_md("mismatch"))
    assert out["success"] is False and "differs" in out["error"]


async def test_every_action_through_the_tool(setup: tuple[ToolRegistry, SkillStore]) -> None:
    registry, store = setup
    c = ctx()
    for args in (
        {"action": "create", "name": "s", "content": skill_md("s")},
        {"action": "edit", "name": "s", "content": skill_md("s", "new steps\n")},
        {"action": "patch", "name": "s", "old_string": "new steps", "new_string": "newer steps"},
        {"action": "write_file", "name": "s", "file_path": "templates/t.md", "file_content": "T"},
    ):
        assert (await call(registry, c, **args))["success"], args
    view = json.loads(
        (await registry.call("skill_view", {"name": "s", "file_path": "templates/t.md"}, c)).content
    )
    assert view["content"] == "T"
    assert (await call(registry, c, action="remove_file", name="s", file_path="templates/t.md"))["success"]
    assert (await call(registry, c, action="delete", name="s"))["success"]
    assert store.own(ALICE) == []
    bad = await call(registry, c, action="write_file", name="s", file_path="../x")
    assert bad["success"] is False and "file_content" in bad["error"]


async def test_a_cron_run_reads_but_cannot_write(setup: tuple[ToolRegistry, SkillStore]) -> None:
    registry, store = setup
    store.create(skill_md("mine"), ALICE)
    cron = ctx(AgentContext.CRON, admin=True)
    for args in (
        {"action": "create", "name": "x", "content": skill_md("x")},
        {"action": "delete", "name": "mine"},
    ):
        out = await call(registry, cron, **args)
        assert out["success"] is False and "read_only" in out["error"]
    view = json.loads((await registry.call("skill_view", {"name": "mine"}, cron)).content)
    assert view["success"] is True
    assert [s.name for s in store.own(ALICE)] == ["mine"]


async def test_a_background_pass_is_add_only_and_user_scoped(setup: tuple[ToolRegistry, SkillStore]) -> None:
    registry, store = setup
    store.create(skill_md("team"), None)
    review = ctx(AgentContext.REVIEW, admin=True)  # even an admin's review never reaches shared skills
    assert (await call(registry, review, action="create", name="learned", content=skill_md("learned")))[
        "success"
    ]
    assert [s.name for s in store.own(ALICE)] == ["learned"]
    for args in (
        {"action": "delete", "name": "learned"},
        {"action": "edit", "name": "team", "content": skill_md("team", "x")},
    ):
        out = await call(registry, review, **args)
        assert out["success"] is False and "add_only" in out["error"]
    out = await call(registry, review, action="patch", name="team", old_string="steps", new_string="x")
    assert out["success"] is False and "not_found" in out["error"]
    assert "steps" in store.read(store.shared()[0])


def test_the_index_is_in_the_system_prompt_and_the_body_is_not(tmp_path: Path) -> None:
    store = SkillStore(tmp_path / "skills")
    store.create(skill_md("deploy", "BODY-TEXT\n"), None, category="ops")
    prompt = render_system_prompt(
        PromptParts(
            persona=None,
            memory_block="",
            user_block=None,
            platform="telegram",
            skills_index=render_index(store.visible(None, "telegram")),
        )
    )
    assert "- deploy [ops]: About deploy." in prompt
    assert "BODY-TEXT" not in prompt


def test_the_index_is_bounded_with_a_note(tmp_path: Path) -> None:
    store = SkillStore(tmp_path / "skills")
    for i in range(60):
        store.create(skill_md(f"skill-{i:02d}"), None)
    index = render_index(store.visible(None), max_chars=1000)
    assert len(index) <= 1000
    assert "more skills not shown" in index and "skills_list" in index
