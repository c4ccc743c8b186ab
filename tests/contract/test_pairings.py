"""PairingRepository: one pending code per user, approve/deny once, expiry, revoke."""

from __future__ import annotations

from mnemo.gateway.inbound.access import PAIRING_TTL_S
from mnemo.memory.scope import UserRef
from tests.contract.conftest import Backend

ALICE = UserRef("telegram", "42")


async def test_request_is_stable_until_decided_and_approve_pairs(backend: Backend) -> None:
    p = backend.pairings
    code = await p.request(ALICE, "Alice")
    assert await p.request(ALICE, "Alice") == code
    assert [(x.code, x.user, x.user_name, x.state) for x in await p.pending()] == [
        (code, ALICE, "Alice", "pending")
    ]
    assert not await p.is_paired(ALICE)
    decided = await p.decide(code.lower(), True, "telegram:1")
    assert decided is not None and (decided.user, decided.state) == (ALICE, "approved")
    assert await p.is_paired(ALICE)
    assert await p.decide(code, False, "telegram:1") is None  # decided once
    assert await p.pending() == []
    assert not await p.is_paired(UserRef("discord", "42"))


async def test_deny_and_revoke_leave_the_user_unpaired(backend: Backend) -> None:
    p = backend.pairings
    code = await p.request(ALICE, "Alice")
    denied = await p.decide(code, False, "cli")
    assert denied is not None and denied.state == "denied" and not await p.is_paired(ALICE)
    again = await p.request(ALICE, "Alice")
    assert again != code
    assert await p.decide(again, True, "cli") is not None
    assert await p.revoke(ALICE) == 1
    assert not await p.is_paired(ALICE)
    assert await p.decide("NOSUCHCODE", True, "cli") is None


async def test_an_expired_code_cannot_be_approved_and_a_new_one_is_issued(backend: Backend) -> None:
    p = backend.pairings
    code = await p.request(ALICE, "Alice")
    backend.clock.advance(PAIRING_TTL_S + 1)
    assert await p.pending() == []
    assert await p.decide(code, True, "cli") is None
    assert await p.request(ALICE, "Alice") != code
