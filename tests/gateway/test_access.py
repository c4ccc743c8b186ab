"""Access control: allowlists, default deny, pairing approve/deny, rate limits."""

from __future__ import annotations

import asyncio

from mnemo.cli.main import main
from mnemo.gateway.emulator import Reply
from tests.support.loopback import LoopbackAdapter


async def test_allowlisted_user_is_answered_and_others_refused(app_factory, emulator):
    emulator.default = lambda req: Reply(text="hello friend")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"access.allowed": ("loop:alice",)}):
        await adapter.say("hi", user="alice")
        await adapter.say("hi", user="mallory")
        await adapter.wait_sent(2)
        await adapter.say("hi again", user="mallory")  # told once per hour
        await asyncio.sleep(0.2)
    texts = {m.chat.chat_id: m.text for m in adapter.sent}
    assert texts["alice"] == "hello friend"
    assert "pairing code" in texts["mallory"]
    assert len([m for m in adapter.sent if m.chat.chat_id == "mallory"]) == 1
    assert len(emulator.requests) == 1


async def test_pairing_code_approved_by_an_admin_lets_the_user_in(app_factory, emulator):
    emulator.default = lambda req: Reply(text="welcome")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"access.allowed": ("loop:bob",)}):
        await adapter.say("hello?", user="newbie")
        refusal = (await adapter.wait_sent(1))[0].text
        code = refusal.rsplit(" ", 1)[-1]
        await adapter.say(f"/pair approve {code}", user="bob")  # allowed, but not an admin
        await adapter.wait_sent(2)
        assert "admins only" in adapter.sent[1].text
        await adapter.say(f"/pair approve {code}", user="admin")
        await adapter.wait_sent(3)
        assert "Approved loop:newbie" in adapter.sent[2].text
        await adapter.say("now?", user="newbie")
        await adapter.wait_sent(4)
        assert adapter.sent[3].text == "welcome"


async def test_denied_pairing_stays_refused(app_factory, emulator):
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"access.allowed": ()}) as app:
        await adapter.say("hello?", user="newbie")
        code = (await adapter.wait_sent(1))[0].text.rsplit(" ", 1)[-1]
        await adapter.say(f"/pair deny {code}", user="admin")
        await adapter.wait_sent(2)
        assert "Denied" in adapter.sent[1].text
        from mnemo.memory.scope import UserRef

        assert not await app.access.pairings.is_paired(UserRef("loop", "newbie"))


async def test_rate_limit_answers_once_then_drops(app_factory, emulator):
    emulator.default = lambda req: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **{"access.rate_limit_per_minute": 2}):
        for i in range(5):
            await adapter.say(f"m{i}", user="fast")
        await adapter.wait_sent(3)
        await asyncio.sleep(0.3)
    texts = adapter.texts("fast")
    assert texts.count("ok") == 2
    assert len([t for t in texts if "faster than I can answer" in t]) == 1
    assert len(texts) == 3


def test_cli_pair_approve(tmp_path, capsys):
    from mnemo.gateway.config import load_settings
    from mnemo.gateway.inbound.access import PairingStore
    from mnemo.gateway.storage import state_database
    from mnemo.memory.scope import UserRef

    home = tmp_path / "home"

    async def request() -> str:
        db = state_database(load_settings(home, environ={}).state_db)
        await db.open()
        try:
            return await PairingStore(db).request(UserRef("telegram", "42"), "Zed")
        finally:
            await db.close()

    code = asyncio.run(request())
    assert main(["--home", str(home), "pair", "list"]) == 0
    assert code in capsys.readouterr().out
    assert main(["--home", str(home), "pair", "approve", "NOPE"]) == 1
    assert main(["--home", str(home), "pair", "approve", code]) == 0
    assert "approved telegram:42" in capsys.readouterr().out
    assert main(["--home", str(home), "pair", "revoke", "telegram:42"]) == 0
    assert main(["--home", str(home), "pair", "revoke", "bad"]) == 2
