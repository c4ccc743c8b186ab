"""Fixtures shared with the gateway tests: the app against the Anthropic emulator
(``app_factory``) and a state database (``db``)."""

from tests.gateway.conftest import app_factory  # noqa: F401 - fixture
from tests.gateway.test_worker import db  # noqa: F401 - fixture
