"""Which accounts are one person: the linked identities, as this process last read them.

A person who linked their Telegram and Discord accounts (``/link``) has one canonical
account; every layer that belongs to the person rather than to a chat — their USER.md
(``MemoryFiles.user``), their budget, their external provider scope — is keyed by it.
Sessions, history and search scopes stay per chat.

``Identities`` is a plain in-memory map, readable from any thread without I/O, so that
the sync places that pick a USER.md path or a provider scope never touch the database.
The gateway owns the table (``gateway/people/links.py``) and replaces the map after
every change and whenever another process changed the links (checked before a session
is resolved); memory/ and providers/ only read it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from mnemo.memory.scope import UserRef


class Identities:
    def __init__(self, links: Iterable[tuple[UserRef, UserRef]] = ()) -> None:
        self._lock = threading.Lock()
        self._canonical: dict[UserRef, UserRef] = {}
        self.generation = -1  # the links' generation this map was read at (-1: never)
        self.replace(links, -1)

    def replace(self, links: Iterable[tuple[UserRef, UserRef]], generation: int) -> None:
        """Install ``(member, canonical)`` pairs read at ``generation``."""
        mapping = {member: canonical for member, canonical in links}
        with self._lock:
            self._canonical = mapping
            self.generation = generation

    def canonical(self, ref: UserRef) -> UserRef:
        """The account whose profile, budget and provider scope ``ref`` uses (itself when
        not linked)."""
        return self._canonical.get(ref, ref)

    def is_linked(self, ref: UserRef) -> bool:
        return ref in self._canonical
