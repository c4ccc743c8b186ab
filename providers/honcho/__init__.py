"""Honcho memory provider (``pip install 'mnemo[honcho]'``)."""

from mnemo.providers.honcho.provider import HonchoProvider

__all__ = ["HonchoProvider"]
