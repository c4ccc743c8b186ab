"""Hindsight memory provider (``pip install 'mnemo[hindsight]'``)."""

from mnemo.providers.hindsight.provider import HindsightProvider

__all__ = ["HindsightProvider"]
