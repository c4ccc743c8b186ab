"""RetainDB memory provider (no extra: a small client on aiohttp)."""

from mnemo.providers.retaindb.provider import RetainDBProvider

__all__ = ["RetainDBProvider"]
