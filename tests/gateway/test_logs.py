import io
import json
import logging

import structlog

from mnemo.gateway.logs import configure_logging


def test_secrets_and_token_shapes_never_reach_the_log() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", secrets=["supersecretvalue"], stream=stream)
    structlog.get_logger("t").info("calling", url="https://x/botsupersecretvalue/getMe")
    # stdlib logger with a Telegram-shaped token in a %-formatted message (like httpx)
    logging.getLogger("some.lib").warning(
        "HTTP Request: POST %s", "https://api/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/getMe"
    )
    out = stream.getvalue()
    assert "supersecretvalue" not in out
    assert "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw" not in out
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["url"] == "https://x/bot[REDACTED]/getMe"
    assert "[REDACTED]" in lines[1]["event"]


def test_console_format_in_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    configure_logging("info", "auto", stream=stream)
    structlog.get_logger("t").info("hello", a=1)
    out = stream.getvalue()
    assert "hello" in out and not out.lstrip().startswith("{")
