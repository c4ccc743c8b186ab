"""ByteRover memory provider (no extra: a small client on aiohttp)."""

from mnemo.providers.byterover.provider import ByteRoverProvider

__all__ = ["ByteRoverProvider"]
