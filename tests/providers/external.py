"""The external memory providers the cross-provider tests run against, each with its fake
API. Adding a provider to those tests is one ``External(...)`` line in ``EXTERNAL``.

A fake has ``start()``/``stop()``, ``base_url``, ``api_key``, ``down`` (answer 503 to
everything) and ``requests`` (every request, recorded before it is answered: method,
path, body and, depending on the fake, the query or the bank).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mnemo.memory.discovery import load_provider
from tests.fakes.byterover_api import FakeByteRover
from tests.fakes.hindsight_api import FakeHindsight
from tests.fakes.honcho_api import FakeHoncho
from tests.fakes.mem0_api import FakeMem0
from tests.fakes.openviking_api import FakeOpenViking
from tests.fakes.retaindb_api import FakeRetainDB
from tests.fakes.supermemory_api import FakeSupermemory


@dataclass(frozen=True)
class External:
    name: str  # as in memory.provider
    fake: Callable[[], Any]  # builds the (not started) fake API
    writes: Callable[[Any], list[Any]]  # the fake's requests that store a turn
    settings: Mapping[str, Any] = field(default_factory=dict)  # beyond api_key, base_url, timeout_s

    def configure(self, home: Path, fake: Any) -> None:
        """Store the provider's settings (``mnemo providers setup`` does the same) so that
        it talks to ``fake``; the caller sets ``memory.provider``."""
        values = {"api_key": fake.api_key, "base_url": fake.base_url, "timeout_s": 2.0, **self.settings}
        load_provider(self.name, home).save_config(values, home)

    def __str__(self) -> str:
        return self.name


EXTERNAL: tuple[External, ...] = (
    External("mem0", FakeMem0, FakeMem0.writes),
    External("hindsight", FakeHindsight, FakeHindsight.retains),
    External("honcho", FakeHoncho, FakeHoncho.message_posts),
    External("retaindb", FakeRetainDB, FakeRetainDB.writes, {"project": "proj"}),
    External(
        "byterover", FakeByteRover, FakeByteRover.turn_commits, {"team_id": "team-1", "space_id": "space-1"}
    ),
    External("openviking", FakeOpenViking, FakeOpenViking.message_posts, {"account": "acct"}),
    External("supermemory", FakeSupermemory, FakeSupermemory.writes),
)


def request_text(request: Any) -> str:
    """Everything a recorded request carries that could name a user or hold their words:
    path, body, and the query, bank or tenant when the fake records one."""
    extra = {k: getattr(request, k) for k in ("query", "bank", "tenant") if hasattr(request, k)}
    return json.dumps([request.method, request.path, request.body, extra], ensure_ascii=False, default=str)


def scopes_in(request: Any, users: Mapping[str, str]) -> set[str]:
    """Which of ``users`` (name → mnemo user id such as ``telegram:5551``) a request names,
    in any of the providers' id forms (``telegram:5551``, ``telegram_5551``, ``telegram-5551``)."""
    text = request_text(request)
    found = set()
    for name, user_id in users.items():
        platform, _, ident = user_id.partition(":")
        if re.search(rf"{re.escape(platform)}[:_-]{re.escape(ident)}(?![0-9A-Za-z])", text):
            found.add(name)
    return found
