"""The erasure's durable write, ``forget_user`` (``memory/durable.py``), against every
external provider we ship with its delete calls: the real SDKs (mem0ai,
hindsight-client, honcho-ai) or our client (RetainDB) against fakes on 127.0.0.1. After
it the provider holds nothing of the user and everything of the other user; sent again
(a retry after a lost answer) it succeeds and changes nothing; a provider that is down
makes it fail, so the job queue keeps it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mnemo.memory.curated import Action, Target
from mnemo.memory.durable import forget_user
from mnemo.memory.memory_tool import MemoryWrite
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.writes import ForgetUser, MirrorWrite, Operation, SyncTurn
from tests.fakes.hindsight_api import FakeHindsight
from tests.fakes.honcho_api import FakeHoncho
from tests.fakes.mem0_api import FakeMem0
from tests.fakes.retaindb_api import FakeRetainDB
from tests.providers.writes import stored

T = asyncio.to_thread
GONE, KEPT = "telegram:1", "telegram:2"


@dataclass
class Rig:
    fake: Any
    make: Callable[[Path], Any]
    state: Callable[[], Any]  # everything the fake holds, JSON-able


def _mem0(fake: FakeMem0) -> Rig:
    def make(home: Path) -> Any:
        from mnemo.providers.mem0 import Mem0Provider

        p = Mem0Provider()
        p.initialize(
            home, {"api_key": "m0-test", "base_url": fake.base_url, "api": "platform", "timeout_s": 5.0}
        )
        return p

    return Rig(fake, make, lambda: fake.memories)


def _hindsight(fake: FakeHindsight) -> Rig:
    def make(home: Path) -> Any:
        from mnemo.providers.hindsight import HindsightProvider

        p = HindsightProvider()
        p.initialize(
            home, {"api_key": "hs-test", "base_url": fake.base_url, "bank_prefix": "mnemo", "timeout_s": 5.0}
        )
        return p

    return Rig(fake, make, lambda: fake.banks)


def _honcho(fake: FakeHoncho) -> Rig:
    def make(home: Path) -> Any:
        from mnemo.providers.honcho import HonchoProvider

        p = HonchoProvider()
        p.initialize(
            home,
            {
                "api_key": "hc-test",
                "base_url": fake.base_url,
                "workspace_id": "ws1",
                "agent_id": "mnemo",
                "timeout_s": 5.0,
            },
        )
        return p

    return Rig(
        fake,
        make,
        lambda: {
            "messages": fake.messages,
            "conclusions": fake.conclusions,
            "sessions": [list(k) for k in fake.sessions],
            "cards": list(fake.cards.values()),
        },
    )


def _retaindb(fake: FakeRetainDB) -> Rig:
    def make(home: Path) -> Any:
        from mnemo.providers.retaindb import RetainDBProvider

        p = RetainDBProvider()
        p.initialize(
            home, {"api_key": "rdb-test", "base_url": fake.base_url, "project": "proj", "timeout_s": 5.0}
        )
        return p

    return Rig(fake, make, lambda: [[list(k), v] for k, v in fake.memories.items()])


FAKES: dict[str, tuple[Callable[[], Any], Callable[[Any], Rig]]] = {
    "mem0": (lambda: FakeMem0("m0-test"), _mem0),
    "hindsight": (lambda: FakeHindsight("hs-test"), _hindsight),
    "honcho": (lambda: FakeHoncho("hc-test"), _honcho),
    "retaindb": (lambda: FakeRetainDB("rdb-test"), _retaindb),
}


@pytest.fixture(params=sorted(FAKES))
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    new_fake, build = FAKES[request.param]
    fake = new_fake()
    await fake.start()
    try:
        yield build(fake)
    finally:
        await fake.stop()


def ctx(home: Path, user: str, session: str) -> ProviderContext:
    return ProviderContext(
        session, f"telegram:dm:{user}", "telegram", UserRef.parse(user), AgentContext.PRIMARY, home
    )


async def write(p: Any, op: Operation | None, c: ProviderContext) -> None:
    assert op is not None
    await T(p.apply_write, stored(p.prepare_write(op, c)))


async def test_forget_user_deletes_that_user_only_and_is_idempotent(rig: Rig, home: Path) -> None:
    p = rig.make(home)
    try:
        for user, word in ((GONE, "walrusquill"), (KEPT, "otterbrass")):
            for session in ("s1", "s2"):
                c = ctx(home, user, f"{session}-{user[-1]}")
                await write(p, SyncTurn(f"I said {word} in {session}", "noted"), c)
            note = MemoryWrite(Action.ADD, Target.USER, UserRef.parse(user), f"Keeps a {word}.", None)
            await write(p, MirrorWrite.of(note, c), c)
        held = json.dumps(rig.state())
        assert "walrusquill" in held and "otterbrass" in held

        payload = stored(forget_user(GONE))  # as the job queue stores it
        assert isinstance(payload.operation, ForgetUser) and payload.scope.user_id == GONE
        await T(p.apply_write, payload)
        held = json.dumps(rig.state())
        assert "walrusquill" not in held, held[:500]
        assert "otterbrass" in held
        await T(p.apply_write, payload)  # sent again: nothing left, no error
        assert json.dumps(rig.state()) == held
        assert rig.fake.deletes(), "the provider's own delete call was used"

        rig.fake.down = True
        with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises; the queue retries it
            await T(p.apply_write, stored(forget_user(KEPT)))
        rig.fake.down = False
        assert "otterbrass" in json.dumps(rig.state())
    finally:
        await T(p.shutdown)
