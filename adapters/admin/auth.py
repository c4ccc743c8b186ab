"""Who may use the dashboard: the sign-in token, server-side sessions, CSRF, and the
Host/Origin rules of the web chat.

* The token (``web.admin_token`` or ``$MNEMO_HOME/admin_token``) is typed once into the
  sign-in form and compared in constant time; it is never stored in a cookie, a URL or
  a log line.
* A valid token opens a server-side session: a random id (the ``HttpOnly``,
  ``SameSite=Strict`` cookie) mapping to a CSRF token and a public label (what the
  log lines name). Sessions end after ``IDLE_S`` without a request, or at sign-out.
* Every write is a POST whose ``csrf`` form field must equal its session's token.
* Failed sign-ins are counted per client address and in total over ``WINDOW_S``; past
  the limit every sign-in is refused (429, even with the right token) until the
  window has moved on.
* On a loopback bind the ``Host`` header must name a loopback host (a site the
  operator visits cannot reach the dashboard by DNS rebinding), and a request whose
  ``Origin`` (or ``Sec-Fetch-Site``) is another site is refused.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web

from mnemo.gateway.webserver import is_loopback

COOKIE = "mnemo_admin"
IDLE_S = 12 * 3600.0
WINDOW_S = 300.0
MAX_FAILURES_PER_CLIENT = 5
MAX_FAILURES_TOTAL = 20

Clock = Callable[[], float]


@dataclass
class AdminSession:
    csrf: str
    label: str  # public: log lines name the session by it, never by its cookie
    last_seen: float
    flash: list[tuple[str, str]] = field(default_factory=list)  # (kind, text) shown once


class Sessions:
    def __init__(self, clock: Clock = time.monotonic, idle_s: float = IDLE_S) -> None:
        self._clock = clock
        self._idle_s = idle_s
        self._by_id: dict[str, AdminSession] = {}

    def open(self) -> tuple[str, AdminSession]:
        sid = secrets.token_urlsafe(32)
        session = AdminSession(
            csrf=secrets.token_urlsafe(32), label=secrets.token_hex(4), last_seen=self._clock()
        )
        self._by_id[sid] = session
        return sid, session

    def get(self, sid: str | None) -> AdminSession | None:
        if not sid:
            return None
        now = self._clock()
        for stale in [k for k, s in self._by_id.items() if now - s.last_seen > self._idle_s]:
            del self._by_id[stale]
        session = self._by_id.get(sid)
        if session is not None:
            session.last_seen = now
        return session

    def close(self, sid: str | None) -> None:
        if sid:
            self._by_id.pop(sid, None)


class SignInLimiter:
    """Failed sign-ins over a sliding window, per client and in total."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._failures: deque[tuple[float, str]] = deque()

    def _trim(self) -> float:
        now = self._clock()
        while self._failures and now - self._failures[0][0] > WINDOW_S:
            self._failures.popleft()
        return now

    def retry_after(self, client: str) -> int | None:
        """Seconds until ``client`` may try again, or None if it may now."""
        now = self._trim()
        mine = [t for t, c in self._failures if c == client]
        if len(mine) >= MAX_FAILURES_PER_CLIENT:
            return max(1, int(WINDOW_S - (now - mine[0])) + 1)
        if len(self._failures) >= MAX_FAILURES_TOTAL:
            return max(1, int(WINDOW_S - (now - self._failures[0][0])) + 1)
        return None

    def failed(self, client: str) -> None:
        self._trim()
        self._failures.append((self._clock(), client))


def token_matches(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("utf-8"))


def check_host_and_origin(request: web.Request, *, loopback_bind: bool) -> None:
    """The web chat's rules (adapters/web.py): a loopback server answers a loopback
    ``Host`` only, and a browser request from another origin is refused."""
    if loopback_bind and not is_loopback(urlsplit(f"//{request.host}").hostname or ""):
        raise web.HTTPForbidden(text="the admin dashboard answers on a loopback address only\n")
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc.lower() != request.host.lower():
        raise web.HTTPForbidden(text="cross-origin request refused\n")
    if request.headers.get("Sec-Fetch-Site") == "cross-site":
        raise web.HTTPForbidden(text="cross-site request refused\n")


def csrf_matches(session: AdminSession, given: object) -> bool:
    return (
        isinstance(given, str) and bool(given) and hmac.compare_digest(given.encode(), session.csrf.encode())
    )
