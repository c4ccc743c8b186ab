"""A profile with something on every dashboard page, written through mnemo's own
stores (sessions, usage, curated files, skills, cron), plus a failed background job."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from mnemo.app import App
from mnemo.backups import backup_now
from mnemo.gateway.cron.service import Caller, parse_chat
from mnemo.memory.scope import UserRef
from mnemo.memory.sessions import NewMessage, ToolCall
from mnemo.memory.skills import SkillStore
from mnemo.memory.usage import Usage

ADMIN_TOKEN = "admin-test-token-0123456789"
ALICE = UserRef("telegram", "1001")
BOB = UserRef("discord", "2002")
ALICE_LAPTOP = UserRef("web", "alice-laptop-01")
FAILED_KIND = "import_note"  # no handler: a retried job waits in the queue, visibly
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def skill_md(name: str, description: str, body: str) -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n\n# {name}\n\n{body}\n"


async def seed(app: App) -> dict[str, Any]:
    store = app.store
    now = datetime.now(UTC)
    alice = await store.create_session(
        chat_key="telegram:dm:1001",
        platform="telegram",
        chat_id="1001",
        thread_id=None,
        user_id="1001",
        agent_context="primary",
        source="chat",
        model="claude-sonnet-4-6",
        system_prompt="(seed)",
        title="Trip to Lyon",
        started_at=now - timedelta(days=2),
    )
    await store.append_messages(
        alice.id,
        [
            NewMessage(
                "user",
                "Which museum did we pick for the Lyon trip?",
                author_id="1001",
                author_name="Alice",
                created_at=now - timedelta(days=2),
            ),
            NewMessage(
                "assistant",
                "Let me look that up.",
                tool_calls=(ToolCall("tc1", "session_search", {"query": "Lyon museum"}),),
                created_at=now - timedelta(days=2),
            ),
            NewMessage(
                "tool",
                json.dumps({"results": ["Musée des Confluences"]}, ensure_ascii=False),
                tool_call_id="tc1",
                tool_name="session_search",
                created_at=now - timedelta(days=2),
            ),
            NewMessage(
                "assistant", "You picked the Musée des Confluences.", created_at=now - timedelta(days=1)
            ),
            NewMessage(
                "user",
                "Great, book the tram tickets <b>tomorrow</b>.",
                author_id="1001",
                author_name="Alice",
                created_at=now,
            ),
        ],
    )
    await store.add_usage(
        alice.id, Usage(input_tokens=1200, output_tokens=300, cost_usd=0.42), payer=str(ALICE)
    )
    bob = await store.create_session(
        chat_key="discord:dm:2002",
        platform="discord",
        chat_id="2002",
        thread_id=None,
        user_id="2002",
        agent_context="primary",
        source="chat",
        model="claude-sonnet-4-6",
        system_prompt="(seed)",
        title="Garden plans",
    )
    await store.append_messages(
        bob.id,
        [
            NewMessage(
                "user",
                "Remind me which tomatoes grew best in the museum garden.",
                author_id="2002",
                author_name="Bob",
            ),
            NewMessage("assistant", "The San Marzano ones."),
        ],
    )
    await store.add_usage(bob.id, Usage(input_tokens=400, output_tokens=90, cost_usd=0.05), payer=str(BOB))

    def earlier_days(conn: Any) -> None:  # spend on earlier days, for the chart
        for back, cost in ((3, 0.8), (5, 1.25), (9, 0.3)):
            day = (now - timedelta(days=back)).date().isoformat()
            conn.execute(
                "INSERT INTO usage_days(payer, day, cost_usd, tokens, requests) VALUES ('*', ?, ?, 1000, 4)",
                (day, cost),
            )

    await app.db.write(earlier_days)

    app.files.user(ALICE).add("Alice prefers short answers.")
    app.files.user(ALICE).add("Alice lives in Lyon.")
    app.files.shared().add("The staging server is called hopper.")

    skills = SkillStore(app.settings.skills_dir)
    skills.create(
        skill_md("weekly-report", "Write the weekly status report.", "Collect the week's notes."), None
    )
    skills.create(skill_md("tram-tickets", "Book tram tickets in Lyon.", "Use the TCL app."), ALICE)
    skills.edit(
        "tram-tickets",
        skill_md("tram-tickets", "Book tram tickets in Lyon (v2).", "Use the TCL site."),
        ALICE,
    )

    assert app.cron is not None
    job = await app.cron.create(
        Caller.operator(),
        kind="cron",
        when="0 9 * * *",
        prompt="Morning summary for Alice",
        target=parse_chat("telegram:1001"),
    )

    def failed_job(conn: Any) -> int:
        t = time.time()
        cur = conn.execute(
            "INSERT INTO jobs(kind, session_id, payload, state, attempts, not_before, created_at, updated_at,"
            " finished_at, error) VALUES (?, ?, '{}', 'failed', 5, ?, ?, ?, ?, ?)",
            (
                FAILED_KIND,
                alice.id,
                t,
                t - 60,
                t,
                t,
                "ConnectionError: provider unreachable after 5 attempts",
            ),
        )
        return int(cur.lastrowid)

    failed = await app.db.write(failed_job)
    assert app.links is not None
    await app.links.link(ALICE, ALICE_LAPTOP)  # Alice's second account: the user page lists it
    backup = (await asyncio.to_thread(backup_now, app.settings, now)).path  # the overview shows it, verified
    return {
        "backup": backup,
        "alice_session": alice.id,
        "bob_session": bob.id,
        "cron_job": job.id,
        "failed_job": failed,
    }
