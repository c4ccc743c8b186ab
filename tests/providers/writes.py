"""Typed provider writes for the provider tests (``memory/writes.py``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mnemo.memory.writes import ProviderWrite


def stored(write: ProviderWrite | Mapping[str, Any] | None) -> ProviderWrite:
    """A write (or a raw job payload) as the job queue hands it back: through its JSON."""
    assert write is not None
    payload = write.to_payload() if isinstance(write, ProviderWrite) else write
    return ProviderWrite.from_payload(json.loads(json.dumps(payload)))
