"""OpenViking memory provider (extra ``openviking``: the ``openviking-sdk`` HTTP SDK)."""

from mnemo.providers.openviking.provider import OpenVikingProvider

__all__ = ["OpenVikingProvider"]
