"""Supermemory memory provider (extra ``mnemo[supermemory]``: the official SDK)."""

from mnemo.providers.supermemory.provider import SupermemoryProvider

__all__ = ["SupermemoryProvider"]
