"""python-telegram-bot's exceptions map onto ``gateway.errors`` in one place, and a flood
wait is read in seconds whichever form PTB gives it, without a warning of our own."""

from __future__ import annotations

import warnings

import pytest
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.error import Forbidden as TgForbidden

from mnemo.adapters.telegram import is_entity_error, platform_errors, retry_after_seconds
from mnemo.gateway.errors import Forbidden, PlatformRateLimited, PlatformUnavailable


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (TgForbidden("Forbidden: bot was blocked by the user"), Forbidden),
        (BadRequest("Bad Request: chat not found"), Forbidden),
        (ChatMigrated(-100123), Forbidden),
        (InvalidToken("Unauthorized"), PlatformUnavailable),
        (Conflict("Conflict: terminated by other getUpdates request"), PlatformUnavailable),
        (TimedOut(), PlatformUnavailable),
        (NetworkError("Bad Gateway"), PlatformUnavailable),
        (TelegramError("something else"), PlatformUnavailable),
    ],
)
def test_each_ptb_error_maps_to_one_gateway_error(raised: Exception, expected: type[Exception]) -> None:
    with pytest.raises(expected) as caught, platform_errors("sending a message"):
        raise raised
    assert "sending a message" in str(caught.value) and caught.value.__cause__ is raised


@pytest.mark.parametrize("timedelta_mode", [False, True])
def test_a_flood_wait_becomes_rate_limited_in_seconds_without_warnings(
    timedelta_mode: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if timedelta_mode:
        monkeypatch.setenv("PTB_TIMEDELTA", "true")
    else:
        monkeypatch.delenv("PTB_TIMEDELTA", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PTB's own constructor reads the deprecated form
        error = RetryAfter(7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert retry_after_seconds(error) == 7.0
        with pytest.raises(PlatformRateLimited) as caught, platform_errors("polling"):
            raise error
    assert caught.value.retry_after == 7.0


def test_entity_errors_are_recognised_as_ptb_words_them() -> None:
    # PTB strips "Bad Request: " and capitalises what is left.
    assert is_entity_error(BadRequest("Bad Request: can't parse entities: unclosed tag at byte offset 3"))
    assert is_entity_error(BadRequest("Can't parse entities: unsupported start tag"))
    assert not is_entity_error(BadRequest("Bad Request: message is too long"))
