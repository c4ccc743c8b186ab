"""structlog, set up once: console in a terminal, JSON otherwise, secrets redacted.

Standard-library loggers (httpx, telegram, discord, aiohttp, apscheduler) are routed
through the same processor chain, so a bot token inside an httpx request URL is
redacted like any other field. Redaction matches configured secret values and the
shapes of well-known tokens (Telegram ``123:ABC…`` has no word boundary inside it).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import structlog

REDACTED = "[REDACTED]"

_TOKEN_SHAPES = re.compile(
    r"(?:\d{6,}:[A-Za-z0-9_-]{30,})"  # Telegram bot token
    r"|(?:sk-ant-[A-Za-z0-9_-]{10,})"  # Anthropic key
    r"|(?:[MNO][A-Za-z0-9_-]{23,25}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,})"  # Discord token
)


class Redactor:
    """A structlog processor that scrubs secrets from every string in the event."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: tuple[str, ...] = ()
        self.set_secrets(secrets)

    def set_secrets(self, secrets: Iterable[str]) -> None:
        # Longest first, so a secret containing another is replaced whole.
        self._secrets = tuple(sorted({s for s in secrets if len(s) >= 6}, key=len, reverse=True))

    def scrub(self, text: str) -> str:
        for s in self._secrets:
            if s in text:
                text = text.replace(s, REDACTED)
        return _TOKEN_SHAPES.sub(REDACTED, text)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {k: self._walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._walk(v) for v in value)
        if isinstance(value, BaseException):
            return self.scrub(f"{type(value).__name__}: {value}")
        return value

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for key in list(event):
            event[key] = self._walk(event[key])
        return event


_redactor = Redactor()
_installed: logging.Handler | None = None  # our root handler, replaced on reconfiguration


def configure_logging(
    level: str = "info",
    fmt: str = "auto",
    secrets: Iterable[str] = (),
    stream: Any = None,
) -> Redactor:
    """Configure structlog and stdlib logging. Safe to call again (e.g. after config load)."""
    stream = stream or sys.stderr
    _redactor.set_secrets(secrets)
    use_console = fmt == "console" or (fmt == "auto" and hasattr(stream, "isatty") and stream.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False) if use_console else structlog.processors.JSONRenderer()
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            _redactor,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.processors.format_exc_info],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _redactor,
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    global _installed
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    _installed = handler
    root.addHandler(handler)
    root.setLevel(level.upper())
    # httpx logs every request URL (with the Telegram token in it) at INFO.
    # The anthropic SDK bundles its own copy as httpx2/httpcore2.
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "apscheduler.executors.default"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    return _redactor


def get_logger(name: str | None = None, **bound: Any) -> structlog.stdlib.BoundLogger:
    return structlog.stdlib.get_logger(name, **bound)
