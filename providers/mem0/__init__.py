"""Mem0 memory provider (``pip install 'mnemo[mem0]'``)."""

from mnemo.providers.mem0.provider import Mem0Provider

__all__ = ["Mem0Provider"]
