"""Every slash command, end to end with real data: loopback adapter -> gateway ->
command registry -> stores, and the answer back through the outbox.

Each command is typed the way a person would, after a conversation that gives it
something to find, show or change — a command that only ever met empty stores is how
``/search`` came to fail on every hit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mnemo.gateway.emulator import Reply, ToolUse
from mnemo.gateway.events import ChatType
from mnemo.memory.scope import UserRef
from tests.support.cli import run_mnemo
from tests.support.loopback import LoopbackAdapter


async def converse(adapter: LoopbackAdapter, emulator, *lines: str, user: str = "u1", **kw) -> list[str]:
    """Say each line and wait for its answer; return the answers' texts."""
    answers = []
    for line in lines:
        before = len(adapter.sent)
        await adapter.say(line, user=user, **kw)
        sent = await adapter.wait_sent(before + 1)
        answers.append(sent[before].text)
    return answers


async def test_search_with_hits_lists_who_said_what_and_when(app_factory, emulator) -> None:
    emulator.script(Reply(text="Green tea it is."), Reply(text="Oolong is lovely too."))
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        await converse(adapter, emulator, "I love green tea", "and oolong tea on Sundays")
        [answer] = await converse(adapter, emulator, "/search tea")
    assert "failed" not in answer
    assert answer.startswith("Conversation of 20"), answer  # the session's date
    lines = answer.splitlines()[1:]
    assert [line.split(" · ", 1)[1] for line in lines] == [
        "you: I love green tea",
        "mnemo: Green tea it is.",
        "you: and oolong tea on Sundays",
        "mnemo: Oolong is lovely too.",
    ], "who said what, in the order it was said"
    assert len(emulator.requests) == 2, "a command never reaches the model"


async def test_search_without_hits_and_without_words(app_factory, emulator) -> None:
    emulator.script(Reply(text="ok"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        await converse(adapter, emulator, "I love green tea")
        nothing, usage, odd = await converse(
            adapter, emulator, "/search coffee", "/search", '/search "( AND *'
        )
    assert nothing == "Nothing found for “coffee” in this chat."
    assert usage == "Usage: /search WORDS"
    assert "failed" not in odd


async def test_search_never_finds_another_chats_messages(app_factory, emulator) -> None:
    emulator.script(Reply(text="noted"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        await converse(adapter, emulator, "my secret word is pomegranate", user="alice")
        [answer] = await converse(adapter, emulator, "/search pomegranate", user="bob")
    assert answer == "Nothing found for “pomegranate” in this chat."


async def test_unknown_commands_point_to_help_and_never_reach_the_model(app_factory, emulator) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        shrug, upper = await converse(adapter, emulator, "/shrug", "/FROBNICATE now")
    assert shrug == "Unknown command /shrug. See /help for the commands I know."
    assert upper == "Unknown command /frobnicate. See /help for the commands I know."
    assert emulator.requests == []


async def test_text_that_only_starts_with_a_slash_is_a_message(app_factory, emulator) -> None:
    emulator.script(Reply(text="That is a folder."))
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        [answer] = await converse(adapter, emulator, "/usr/bin is where it lives")
    assert answer == "That is a folder."


async def test_help_lists_every_command_of_the_registry_admin_ones_for_admins(app_factory, emulator) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        [user_help] = await converse(adapter, emulator, "/help")
        [admin_help] = await converse(adapter, emulator, "/start", user="admin")
        names = [c.name for c in app.commands.infos()]
    assert "cron" in names and "pair" in names
    for name in names:
        assert f"/{name} — " in admin_help
        assert (f"/{name} — " in user_help) is (name != "pair")


async def test_status_after_a_conversation_shows_tokens_cost_and_queue(app_factory, emulator) -> None:
    emulator.script(Reply(text="hello"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        await converse(adapter, emulator, "hi")
        [status] = await converse(adapter, emulator, "/status")
    assert status.startswith("Session ")
    assert "Messages: 2, tool calls: 0" in status
    assert "Estimated cost: $" in status
    assert "Queued in this chat: 0" in status


async def test_reset_and_new_start_a_new_session(app_factory, emulator) -> None:
    emulator.script(Reply(text="one"), Reply(text="two"))
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        [empty] = await converse(adapter, emulator, "/reset")
        await converse(adapter, emulator, "hi")
        first = await app.store.active_session("loop:dm:u1")
        [ended] = await converse(adapter, emulator, "/new")
        assert await app.store.active_session("loop:dm:u1") is None
        await converse(adapter, emulator, "hi again")
        second = await app.store.active_session("loop:dm:u1")
    assert empty == "Starting fresh — there was no conversation to close."
    assert ended.startswith("Started a new conversation")
    assert first.id != second.id


async def test_stop_without_and_with_a_running_turn(app_factory, emulator) -> None:
    release = asyncio.Event()

    async def slow(request):
        await release.wait()
        return Reply(text="too late")

    emulator.script(slow)
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        [nothing] = await converse(adapter, emulator, "/stop")
        await adapter.say("think for a long time")
        for _ in range(200):
            if emulator.requests:
                break
            await asyncio.sleep(0.01)
        before = len(adapter.sent)
        await adapter.say("/stop")
        await adapter.wait_sent(before + 1)
        release.set()
        await app.gateway.lanes.drain(10.0)
        await app.gateway.delivery.deliver_due()
        pending = await app.db.read(
            lambda c: c.execute("SELECT count(*) FROM inbox WHERE state != 'done'").fetchone()[0]
        )
    texts = [m.text for m in adapter.sent[before:]]
    assert nothing == "Nothing to stop."
    assert texts == ["Stopped."], "one message, not two"
    assert pending == 0, "the stopped message is done, not answered again after a restart"


async def test_memory_and_forget_on_a_real_profile(app_factory, emulator) -> None:
    emulator.script(
        Reply(
            tool_uses=[ToolUse("memory", {"action": "add", "target": "user", "content": "Likes green tea"})]
        ),
        Reply(text="Saved."),
    )
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        await converse(adapter, emulator, "remember that I like green tea")
        [shown] = await converse(adapter, emulator, "/memory")
        [group] = await converse(adapter, emulator, "/memory", chat="g1", chat_type=ChatType.GROUP)
        usage, missing, forgotten, again = await converse(
            adapter, emulator, "/forget", "/forget coffee", "/forget green tea", "/memory"
        )
        app.files.user(UserRef("loop", "u1")).add("Lives in Lyon")
        app.files.user(UserRef("loop", "u1")).add("Has a cat")
        [cleared] = await converse(adapter, emulator, "/forget all")
        left = app.files.user(UserRef("loop", "u1")).load().entries
    assert "USER PROFILE" in shown and "Likes green tea" in shown
    assert "MEMORY (your personal notes)" not in shown and "shared notes" not in shown, (
        "only admins see MEMORY.md"
    )
    assert group.startswith("Your profile is private")
    assert usage.startswith("Usage: /forget TEXT")
    assert "coffee" in missing or "No entry" in missing or "no entry" in missing.lower()
    assert forgotten == "Forgotten."
    assert again.startswith("Your profile is empty")
    assert cleared == "Forgot 2 entries of your profile."
    assert left == ()


async def test_memory_for_an_admin_shows_the_shared_notes_and_an_unreadable_profile_says_so(
    app_factory, emulator
) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        app.files.shared().add("Server runs Debian 12")
        path = app.files.user(UserRef("loop", "admin")).path
        path.parent.mkdir(parents=True)
        path.write_bytes(b"caf\xe9\n")
        [shown] = await converse(adapter, emulator, "/memory", user="admin")
    assert "Server runs Debian 12" in shown
    assert "cannot be read" in shown and "not valid UTF-8" in shown
    assert "profile is empty" not in shown


async def test_pair_list_approve_deny_revoke_for_admins_only(app_factory, emulator) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"access.allowed": ("loop:admin",), "access.pairing": True}) as app:
        await adapter.say("hello?", user="stranger")
        await adapter.say("me too", user="other")
        await adapter.wait_sent(2)
        pending = await app.access.pairings.pending()
        codes = {str(p.user): p.code for p in pending}
        listed, approved, denied, bad, revoked, unknown = await converse(
            adapter,
            emulator,
            "/pair list",
            f"/pair approve {codes['loop:stranger']}",
            f"/pair deny {codes['loop:other']}",
            "/pair revoke nocolon",
            "/pair revoke loop:stranger",
            "/pair approve ZZZZZZ",
            user="admin",
        )
    assert codes["loop:stranger"] in listed and codes["loop:other"] in listed
    assert approved.startswith("Approved loop:stranger")
    assert denied.startswith("Denied loop:other")
    assert bad.startswith("Not a user:")
    assert revoked == "Revoked."
    assert unknown.startswith("No pending request with code ZZZZZZ")


async def test_pair_is_refused_to_non_admins(app_factory, emulator) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        [answer] = await converse(adapter, emulator, "/pair list")
    assert answer == "/pair is for the bot's admins only."


async def test_cron_add_list_pause_resume_remove_in_a_chat(app_factory, emulator) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter):
        [empty] = await converse(adapter, emulator, "/cron")
        [added] = await converse(adapter, emulator, "/cron add every 2h water the plants")
        job_id = added.split()[1].rstrip(":")
        listed, paused, resumed, removed, after = await converse(
            adapter,
            emulator,
            "/cron list",
            f"/cron pause {job_id}",
            f"/cron resume {job_id}",
            f"/cron remove {job_id}",
            "/cron list",
        )
        [other_chat] = await converse(adapter, emulator, f"/cron remove {job_id}", user="u2")
    assert empty.startswith("No scheduled jobs here.")
    assert added.startswith(f"Scheduled {job_id}:") and "water the plants" in added
    assert job_id in listed and "water the plants" in listed
    assert paused.startswith(f"Paused {job_id}.")
    assert resumed.startswith(f"Resumed {job_id}.")
    assert removed == f"Removed {job_id}."
    assert after.startswith("No scheduled jobs here.")
    assert other_chat.startswith("Sorry:")


@pytest.mark.parametrize(
    "line",
    [
        "/cron add cron * * * * * * x",  # six fields: not a 5-field crontab
        "/cron add cron 61 * * * * x",  # minute out of range
        "/cron add every 0s x",  # no interval
        "/cron add every 2h",  # no prompt
        "/cron add at yesterday x",  # not a time
        "/cron add cron @sometimes x",  # unknown alias
    ],
)
async def test_cron_add_refuses_bad_schedules_with_a_clear_message(app_factory, emulator, line: str) -> None:
    adapter = LoopbackAdapter()
    async with app_factory(adapter) as app:
        [answer] = await converse(adapter, emulator, line)
        jobs = await app.cron.store.all()
    assert jobs == [], f"{line!r} created {jobs}"
    assert answer and not answer.startswith("Scheduled")


def test_piped_mnemo_chat_search_finds_what_was_said(tmp_path: Path) -> None:
    """The new user's report, verbatim: a /search with a hit in `mnemo chat`."""
    out = run_mnemo(tmp_path / "home", "chat", stdin="I love green tea\n/search tea\n/nosuchthing\n")
    assert out.returncode == 0, out.stderr
    assert "failed unexpectedly" not in out.stdout
    # The search answer quotes the first line back, with who said it, and no tool output.
    answer = out.stdout[out.stdout.index("Conversation of ") :]
    assert "· you: I love green tea" in answer, out.stdout
    assert "tool:" not in answer and '{"success"' not in answer
    assert "Unknown command /nosuchthing" in out.stdout


def test_trial_mode_status_shows_no_dollar_cost_for_scripted_replies(tmp_path: Path) -> None:
    out = run_mnemo(tmp_path / "home", "chat", stdin="hello\n/status\n")
    assert out.returncode == 0, out.stderr
    status = out.stdout[out.stdout.index("Session ") :]
    assert "$" not in status
    assert "scripted replies cost nothing" in status
