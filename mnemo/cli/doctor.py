"""``mnemo doctor``: check a profile before (or while) running it, one line per check.

    ✓ config: /srv/mnemo/config.yaml is valid
    ✗ .env: mode 0644 — other users can read your secrets; run: chmod 600 /srv/mnemo/.env
    – llm: skipped — local trial mode (no ANTHROPIC_API_KEY): replies are scripted

``✓`` passed, ``✗`` failed, ``–`` skipped (does not fail the run). Exit 0 when nothing
failed, 1 otherwise. An invalid config never reaches this module: ``mnemo`` itself
stops with exit 2 and the list of bad keys.

The network checks are plain HTTP calls with a short timeout and no platform SDK (the
gateway package never imports one): the LLM endpoint is asked for ``GET /v1/models``
(free, and it checks the key) and, where a compatible endpoint has no such route, for a
one-token message; Telegram for ``getMe`` and Discord for ``GET /users/@me``, through
the configured base URLs. With ``database.url`` the database check is the PostgreSQL
server's (reachable, its version, the schema step against this mnemo's; nothing is
written) instead of ``state.db``'s. Each MCP server of ``mcp.servers`` is started or
connected and asked for its tools, like ``mnemo mcp list`` (within
``mcp.connect_timeout_s``: a server process may take longer to start than an HTTP check).
Secrets never appear in the output: every line is scrubbed of
every configured secret value, because an error may quote a URL holding the Telegram
token.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import socket
import sqlite3
import stat
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from mnemo.cli.terminal import colored, paint, spinner
from mnemo.gateway.config import Settings
from mnemo.gateway.errors import StartupError
from mnemo.gateway.storage import Probe, backend_for
from mnemo.memory.errors import ProviderError, StoreError

if TYPE_CHECKING:  # aiohttp is imported by the network checks, so `mnemo doctor --help` stays quick
    import aiohttp

ANTHROPIC_API = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
DISCORD_API = "https://discord.com/api/v10"
TIMEOUT_S = 3.0  # per check, whole: every check runs at once, so doctor takes about this long


class Status(Enum):
    PASS = ("✓", "OK")
    FAIL = ("✗", "FAIL")
    SKIP = ("–", "SKIP")

    def mark(self, unicode: bool) -> str:
        return self.value[0] if unicode else self.value[1]


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor", help="check config, file permissions, database and every configured endpoint"
    )
    p.add_argument(
        "--timeout", type=float, default=TIMEOUT_S, help=f"seconds per network check (default {TIMEOUT_S:g})"
    )
    p.add_argument("--json", action="store_true", help="print {ok, checks: [{name, status, detail}]}")
    p.set_defaults(handler=doctor)


# --- local checks -------------------------------------------------------------------------
def check_config(settings: Settings) -> Check:
    if settings.trial_mode:
        mode = "local trial mode (nothing configured)"
    else:
        mode = "platforms: " + (", ".join(settings.platform_tokens) or "none (web chat only)")
    where = (
        f"{settings.config_path} is valid"
        if settings.config_path.exists()
        else "no config.yaml, built-in defaults"
    )
    return Check("config", Status.PASS, f"{where}; {mode}")


def check_home(settings: Settings) -> Check:
    home = settings.home
    if not home.is_dir():
        return Check("home", Status.FAIL, f"{home} does not exist (create it with: mkdir -m 700 {home})")
    mode = stat.S_IMODE(home.stat().st_mode)
    if mode & 0o022:
        return Check(
            "home",
            Status.FAIL,
            f"{home} is group/world-writable (mode {mode:04o}): others could rewrite the bot's memory "
            f"and config; run: chmod go-w {home}",
        )
    if not os.access(home, os.R_OK | os.W_OK | os.X_OK):
        return Check("home", Status.FAIL, f"{home} is not readable and writable by this user")
    return Check("home", Status.PASS, f"{home} (mode {mode:04o})")


def check_dotenv(settings: Settings) -> Check:
    path = settings.home / ".env"
    if not path.exists():
        return Check(".env", Status.SKIP, "none (secrets come from the environment)")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return Check(
            ".env", Status.FAIL, f"mode {mode:04o}: other users can read your secrets; run: chmod 600 {path}"
        )
    return Check(".env", Status.PASS, f"{path} (mode {mode:04o})")


def _check(probe: Probe) -> Check:
    return Check(probe.name, Status[probe.state.name], probe.detail)


def check_memories(settings: Settings) -> Check:
    """MEMORY.md and the USER.md files, as the configured backend keeps them."""
    try:
        backend = backend_for(settings)
    except StartupError as e:  # the postgres extra is missing: the database check says so
        return Check("memories", Status.SKIP, str(e))
    return _check(backend.probe_memories())


async def check_database(settings: Settings, timeout_s: float = TIMEOUT_S) -> Check:
    """The configured database, read-only: SQLite's ``state.db`` (``quick_check``, then
    opened), or ``database.url``'s server (reachable, its version, the schema step
    against this mnemo's; nothing is written)."""
    try:
        backend = backend_for(settings)
    except StartupError as e:
        return Check("postgresql", Status.FAIL, str(e))
    return _check(await backend.probe(timeout_s))


async def check_search_index(settings: Settings) -> Check:
    """How complete session_search's index is (after the database check passed), as the
    backend tells it without writing anything. Incomplete is not a failure: searches
    answer meanwhile and say so."""
    return _check(await backend_for(settings).probe_search())


# --- network checks -----------------------------------------------------------------------
def _error_text(body: Any) -> str:
    """The human part of an API error body (Anthropic, Telegram or Discord shape)."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:200]
        for key in ("description", "message"):
            if body.get(key):
                return str(body[key])[:200]
    return ""


async def _request(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.request(method, url, **kw) as resp:
        raw = await resp.read()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, None


def _failed(name: str, status: int, body: Any, what: str) -> Check:
    if status in (401, 403):
        return Check(name, Status.FAIL, f"{what} rejected (HTTP {status}) {_error_text(body)}".rstrip())
    return Check(name, Status.FAIL, f"HTTP {status} {_error_text(body)}".rstrip())


async def check_llm(settings: Settings, http: aiohttp.ClientSession) -> Check:
    if settings.trial_mode:
        return Check("llm", Status.SKIP, "local trial mode (no ANTHROPIC_API_KEY): replies are scripted")
    base = (settings.llm.base_url or ANTHROPIC_API).rstrip("/")
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    if settings.llm.api_key is not None:
        headers["x-api-key"] = settings.llm.api_key.get_secret_value()
    status, body = await _request(http, "GET", f"{base}/v1/models?limit=1", headers=headers)
    if status == 200:
        return Check("llm", Status.PASS, f"{base} answers and accepts the key")
    if status not in (404, 405):
        return _failed("llm", status, body, "API key")
    # An Anthropic-compatible endpoint without /v1/models: the cheapest real call.
    probe = {
        "model": settings.llm.aux_model,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "ping"}],
    }
    status, body = await _request(http, "POST", f"{base}/v1/messages", headers=headers, json=probe)
    if status == 200:
        return Check("llm", Status.PASS, f"{base} answers a 1-token message ({settings.llm.aux_model})")
    return _failed("llm", status, body, "API key")


async def check_telegram(settings: Settings, http: aiohttp.ClientSession) -> Check:
    assert settings.telegram.bot_token is not None
    base = settings.telegram.api_base_url.rstrip("/")
    token = settings.telegram.bot_token.get_secret_value()
    status, body = await _request(http, "GET", f"{base}/bot{token}/getMe")
    if status == 200 and isinstance(body, dict) and body.get("ok") and isinstance(body.get("result"), dict):
        me = body["result"]
        mode = "webhook" if settings.telegram.webhook_url else "long polling"
        return Check("telegram", Status.PASS, f"@{me.get('username')} (id {me.get('id')}) via {base}, {mode}")
    return _failed("telegram", status, body, "bot token")


async def check_discord(settings: Settings, http: aiohttp.ClientSession) -> Check:
    assert settings.discord.bot_token is not None
    base = (settings.discord.api_base_url or DISCORD_API).rstrip("/")
    headers = {"Authorization": f"Bot {settings.discord.bot_token.get_secret_value()}"}
    status, body = await _request(http, "GET", f"{base}/users/@me", headers=headers)
    if status == 200 and isinstance(body, dict) and body.get("id"):
        return Check("discord", Status.PASS, f"{body.get('username')} (id {body['id']}) via {base}")
    return _failed("discord", status, body, "bot token")


async def check_web(settings: Settings, http: aiohttp.ClientSession) -> Check:
    from mnemo.gateway.webserver import is_loopback

    web = settings.web
    what = "web chat, /healthz, /metrics" if web.enabled else "/healthz, /metrics (web chat disabled)"
    if not is_loopback(web.host) and web.access_token is None:
        return Check(
            "web", Status.FAIL, f"{web.host} is not a loopback address and MNEMO_WEB_TOKEN is not set"
        )
    if web.port == 0:
        return Check("web", Status.PASS, f"{web.host}, a free port is picked at start ({what})")
    try:
        infos = socket.getaddrinfo(web.host, web.port, type=socket.SOCK_STREAM)
        family, kind, proto, _, addr = infos[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            return Check("web", Status.FAIL, f"cannot bind {web.host}:{web.port}: {e.strerror or e}")
        return await _port_in_use(http, web.host, web.port)
    return Check("web", Status.PASS, f"{web.host}:{web.port} is free ({what})")


async def _port_in_use(http: aiohttp.ClientSession, host: str, port: int) -> Check:
    import aiohttp

    shown = f"[{host}]" if ":" in host else host
    # Within the check's own deadline (_guarded), so a program that accepts and never
    # answers is named as such rather than reported as the deadline.
    probe = aiohttp.ClientTimeout(total=0.6 * (http.timeout.total or 5.0))
    try:
        _, body = await _request(http, "GET", f"http://{shown}:{port}/healthz", timeout=probe)
    except (aiohttp.ClientError, TimeoutError):
        body = None
    if isinstance(body, dict) and "adapters" in body:
        return Check(
            "web", Status.PASS, f"{host}:{port} is in use by a running mnemo (/healthz: {body.get('status')})"
        )
    return Check("web", Status.FAIL, f"{host}:{port} is in use by another program")


# --- the external memory provider (memory.provider) ---------------------------------------
# A provider's hosted API when neither its base_url setting nor <NAME>_BASE_URL is set.
PROVIDER_HOSTED_URLS = {
    "mem0": "https://api.mem0.ai",
    "honcho": "https://api.honcho.dev",
    "retaindb": "https://api.retaindb.com",
    "supermemory": "https://api.supermemory.ai",
    "byterover": "https://prod-beta-cgit.byterover.dev/api/v1",
    "openviking": "http://127.0.0.1:1933",  # self-hosted server's default port
}


def provider_base_url(settings: Settings, name: str) -> str:
    """Where provider ``name`` is called: its ``base_url`` setting, else ``<NAME>_BASE_URL``,
    else its hosted API ('' when none is known)."""
    from mnemo.memory.provider_config import read_provider_config

    stored = read_provider_config(settings.home, name).get("base_url")
    env = os.environ.get(f"{name.upper()}_BASE_URL")
    return str(stored or env or PROVIDER_HOSTED_URLS.get(name, "")).rstrip("/")


def provider_secrets(settings: Settings) -> tuple[str, ...]:
    """The active provider's stored secrets (``providers/<name>/secrets.json``), scrubbed
    from the output like the other secrets."""
    from mnemo.memory.provider_config import SECRETS_FILE

    name = settings.memory.provider
    if not name:
        return ()
    try:
        stored = json.loads((settings.providers_dir / name / SECRETS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    return tuple(str(v) for v in stored.values() if v) if isinstance(stored, dict) else ()


def _recorded(settings: Settings, name: str) -> str:
    """What the gateway last recorded about the provider (``providers/<name>/status.json``)."""
    from mnemo.memory.durable import read_status

    recorded = read_status(settings.providers_dir / name)
    return f"; the gateway's last error: {recorded['last_error']}" if recorded.get("last_error") else ""


def active_provider_row(settings: Settings) -> dict[str, Any] | None:
    """The ``mnemo providers list`` row of ``memory.provider`` (blocking: discovery
    imports the providers and their SDKs, which may take seconds — run it in a thread,
    before the network deadline starts)."""
    from mnemo.cli.provider_status import provider_rows

    return next((r for r in provider_rows(settings) if r["name"] == settings.memory.provider), None)


async def check_provider(
    settings: Settings, http: aiohttp.ClientSession, row: dict[str, Any] | None
) -> Check:
    """Configured, available here, and reachable: any HTTP answer below 500 from its base
    URL means the server is up (the probe sends no key, so 401/404 are fine); 5xx or no
    answer means the gateway's writes to it are being queued."""
    import aiohttp

    from mnemo.cli.provider_status import BUILTIN_LOCAL

    name = settings.memory.provider
    assert name is not None
    if row is None or not row["available"]:
        reason = row["reason"] if row else "unknown provider"
        return Check(
            "provider", Status.FAIL, f"{name} is configured (memory.provider) but unavailable: {reason}"
        )
    try:
        base = provider_base_url(settings, name)
    except ProviderError as e:
        return Check("provider", Status.FAIL, str(e))
    if name in BUILTIN_LOCAL:
        return Check("provider", Status.PASS, f"{name} (local, in this profile){_recorded(settings, name)}")
    if not base:
        return Check("provider", Status.SKIP, f"{name}: no base URL known to probe (set its base_url)")
    try:
        status, _ = await _request(http, "GET", f"{base}/")
    except aiohttp.ClientError as e:
        return Check("provider", Status.FAIL, f"{name} at {base} unreachable: {e}{_recorded(settings, name)}")
    if status >= 500:
        return Check(
            "provider",
            Status.FAIL,
            f"{name} at {base} answers HTTP {status} (down){_recorded(settings, name)}",
        )
    return Check(
        "provider", Status.PASS, f"{name} at {base} is reachable (HTTP {status}){_recorded(settings, name)}"
    )


async def check_provider_writes(settings: Settings) -> Check:
    """The provider's queued and failed writes (job kind ``provider_write``)."""
    from mnemo.cli.provider_status import write_counts

    name = settings.memory.provider
    assert name is not None
    if not settings.home.is_dir():
        return Check("provider writes", Status.SKIP, "no home folder yet")
    try:
        counts = await write_counts(settings, name)
    except (StoreError, sqlite3.Error, OSError) as e:
        return Check("provider writes", Status.FAIL, f"cannot read the job queue: {e}")
    detail = (
        f"{counts['queued_writes']} queued, {counts['failed_writes']} failed, {counts['done_writes']} done"
    )
    if counts["failed_writes"]:
        return Check(
            "provider writes", Status.FAIL,
            f"{detail}; last error: {counts['last_write_error'] or 'unknown'} — failed writes are not retried",
        )  # fmt: skip
    if counts["queued_writes"] and counts["last_write_error"]:
        detail += f" (waiting to be retried; last error: {counts['last_write_error']})"
    return Check("provider writes", Status.PASS, detail)


NetworkCheck = Callable[[Settings, "aiohttp.ClientSession"], Awaitable[Check]]


async def _guarded(
    name: str, check: NetworkCheck, settings: Settings, http: aiohttp.ClientSession, timeout_s: float
) -> Check:
    import aiohttp

    try:
        # One deadline for the whole check (the LLM check may make two requests).
        async with asyncio.timeout(timeout_s):
            return await check(settings, http)
    except TimeoutError:
        return Check(name, Status.FAIL, f"unreachable: no answer within {timeout_s:g} s")
    except aiohttp.ClientError as e:
        return Check(name, Status.FAIL, f"unreachable: {e}")


async def check_mcp(settings: Settings) -> list[Check]:
    """One check per MCP server: it answers and lists tools (``mnemo mcp list``'s probe)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return [
            Check(
                "mcp", Status.FAIL, "mcp.servers is set but the MCP SDK is missing: pip install 'mnemo[mcp]'"
            )
        ]
    from mnemo.cli.mcp import probe

    report = await probe(settings)
    return [
        Check(f"mcp {s.name}", Status.PASS if s.state == "ok" else Status.FAIL, s.line().split(": ", 1)[1])
        for s in report.servers
    ]


async def run_checks(settings: Settings, *, timeout_s: float = TIMEOUT_S) -> list[Check]:
    import aiohttp

    checks = [check_config(settings), check_home(settings), check_dotenv(settings), check_memories(settings)]
    database = asyncio.create_task(
        check_database(settings, timeout_s)
    )  # awaited below, alongside the network
    mcp = asyncio.create_task(check_mcp(settings)) if settings.mcp.servers else None
    network: list[tuple[str, NetworkCheck]] = [("llm", check_llm)]
    if settings.telegram.bot_token is not None:
        network.append(("telegram", check_telegram))
    if settings.discord.bot_token is not None:
        network.append(("discord", check_discord))
    network.append(("web", check_web))
    if settings.memory.provider:
        row = await asyncio.to_thread(active_provider_row, settings)

        async def provider_probe(s: Settings, http: aiohttp.ClientSession) -> Check:
            return await check_provider(s, http, row)

        network.append(("provider", provider_probe))
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            probes = await asyncio.gather(
                *(_guarded(name, fn, settings, http, timeout_s) for name, fn in network)
            )
    finally:
        checks.append(await database)
    if checks[-1].status is Status.PASS:
        checks.append(await check_search_index(settings))
    if settings.memory.provider:  # after the database check, which creates and migrates it
        probes.append(await check_provider_writes(settings))
    if mcp is not None:
        probes += await mcp
    return checks + probes


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


_MARK_COLOR = {Status.PASS: "green", Status.FAIL: "red", Status.SKIP: "dim"}


def render(check: Check, secrets: tuple[str, ...], *, unicode: bool = True, color: bool = False) -> str:
    """One line; the mark coloured on a terminal unless NO_COLOR (``terminal.colored``)."""
    mark = paint(check.status.mark(unicode), _MARK_COLOR[check.status], color)
    return scrub(f"{mark} {check.name}: {check.detail}", secrets)


def doctor(args: argparse.Namespace, settings: Settings) -> int:
    with spinner("checking config, database and endpoints"):
        checks = asyncio.run(run_checks(settings, timeout_s=args.timeout))
    encoding = sys.stdout.encoding or "ascii"
    try:
        "✓✗–".encode(encoding)
        unicode = True
    except (UnicodeEncodeError, LookupError):
        unicode = False
    secrets = settings.secret_values() + provider_secrets(settings)
    if args.json:
        body = {
            "ok": not any(c.status is Status.FAIL for c in checks),
            "checks": [
                {"name": c.name, "status": c.status.name.lower(), "detail": scrub(c.detail, secrets)}
                for c in checks
            ],
        }
        print(json.dumps(body, ensure_ascii=False, indent=2))
        return 0 if body["ok"] else 1
    color = colored(sys.stdout)
    for check in checks:
        print(render(check, secrets, unicode=unicode, color=color))
    failed = [c.name for c in checks if c.status is Status.FAIL]
    print(f"{len(failed)} check(s) failed: {', '.join(failed)}" if failed else "all checks passed")
    return 1 if failed else 0
