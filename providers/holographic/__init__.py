"""The holographic memory provider: local facts in SQLite with phase-HRR vectors.

``hrr`` holds the vector algebra, ``entities`` the deterministic extraction, ``store``
the SQLite schema and writes, ``retrieval`` the ranking, ``provider`` the
``MemoryProvider`` the manager talks to. Registered through the
``mnemo.memory_providers`` entry point like any third-party provider.
"""

from mnemo.providers.holographic.provider import HolographicProvider

__all__ = ["HolographicProvider"]
