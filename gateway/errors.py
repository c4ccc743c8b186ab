"""The gateway's exception tree. SDK errors are mapped onto it in one place each
(the LLM client for anthropic, each adapter for its platform library).

    MnemoError
    ├── ConfigError                  bad config.yaml / environment; names the key
    ├── StartupError                 refuses to start (e.g. platform token, no LLM key)
    ├── LLMError                     the model could not answer
    │   ├── RateLimited(retry_after) 429 / 529 after the last retry
    │   ├── TransientNetworkError    timeouts, connection errors, 5xx after retries
    │   ├── ProviderAuthError        401 / 403 from the LLM endpoint
    │   ├── ContextTooLong           the request does not fit the context window
    │   ├── InvalidLLMRequest        400 for another reason (a bug on our side)
    │   └── BadLLMResponse           malformed or unexpected response body
    ├── OverBudget(retry_after_s)    a spending cap forbids this model request (budgets)
    ├── PlatformError                a chat platform refused or failed a call
    │   ├── PlatformRateLimited(retry_after)
    │   ├── PlatformUnavailable      network down, 5xx; retry later
    │   └── Forbidden                blocked by the user, no access to the chat
    ├── CronError                    a scheduled job could not be created or changed
    │   ├── InvalidJob               bad schedule, time zone, target or prompt; nothing stored
    │   ├── JobNotFound              no such job, or not visible to the caller
    │   └── JobNotAllowed            visible, but the caller may not change it
    └── ArchiveRefused               an export, backup or restore that cannot be done; nothing changed
        └── UnsafeArchive            a damaged, hostile or foreign archive; nothing written

Memory-layer errors live in ``memory/errors.py`` (memory never imports gateway).
"""

from __future__ import annotations

from datetime import datetime


class MnemoError(Exception):
    """Base of every error mnemo raises on purpose."""


class ConfigError(MnemoError):
    pass


class StartupError(MnemoError):
    pass


class LLMError(MnemoError):
    pass


class RateLimited(LLMError):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TransientNetworkError(LLMError):
    pass


class ProviderAuthError(LLMError):
    pass


class ContextTooLong(LLMError):
    pass


class InvalidLLMRequest(LLMError):
    pass


class BadLLMResponse(LLMError):
    pass


class OverBudget(MnemoError):
    """No model request may be made for this person (or the whole bot) until a cap
    resets (``gateway/budgets/gate.py``). Not an ``LLMError``: nothing failed, and a
    caller that treats model failures as a fallback must not do so here — background
    work waits for the reset instead (``retry_after_s``, read by the job queue)."""

    def __init__(self, message: str, cap: str, resets_at: datetime, retry_after_s: float) -> None:
        super().__init__(message)
        self.cap = cap
        self.resets_at = resets_at
        self.retry_after_s = retry_after_s


class PlatformError(MnemoError):
    pass


class PlatformRateLimited(PlatformError):
    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PlatformUnavailable(PlatformError):
    pass


class Forbidden(PlatformError):
    pass


class CronError(MnemoError):
    pass


class InvalidJob(CronError, ValueError):
    pass


class JobNotFound(CronError):
    pass


class JobNotAllowed(CronError):
    pass


class ArchiveRefused(MnemoError):
    """An export, backup or restore refused (the message says why in one line): a bad
    target, a store that cannot be read, a target that holds data without ``--force``."""


class UnsafeArchive(ArchiveRefused):
    """An archive that is damaged, hostile (paths out of the home, links, bombs) or not
    a mnemo archive; refused before anything is written."""
