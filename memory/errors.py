"""The memory layer's exception tree (memory/ never imports gateway/).

MemoryLayerError
├── InvalidIdentifier        a platform or user id that could escape its folder
├── MemoryRefused(reason)    a curated-memory write refused (limit, scan, policy)
├── MemoryUnreadable         a memory file exists but cannot be read or decoded
├── StoreError               the session store failed
│   ├── StoreBusy            still locked after the bounded retries
│   └── SchemaTooNew         state.db was written by a newer mnemo
├── InvalidSearchQuery       an empty or unusable search query
├── InvalidDataset           a recall dataset file that cannot be read
└── ProviderError            a memory provider failed (isolated by the manager)
"""

from __future__ import annotations


class MemoryLayerError(Exception):
    pass


class InvalidIdentifier(MemoryLayerError, ValueError):
    pass


class MemoryRefused(MemoryLayerError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MemoryUnreadable(MemoryLayerError):
    pass


class StoreError(MemoryLayerError):
    pass


class StoreBusy(StoreError):
    pass


class SchemaTooNew(StoreError):
    pass


class InvalidSearchQuery(MemoryLayerError, ValueError):
    pass


class InvalidDataset(MemoryLayerError, ValueError):
    pass


class ProviderError(MemoryLayerError):
    pass
