"""``mnemo mcp``: MCP both ways.

* ``list [--json]`` connects to every server of ``mcp.servers`` now and shows its state
  and the tools the agent is offered (``SERVER__TOOL``), and who may use them.
* ``reload`` asks the running mnemo (every replica) to read ``mcp.servers`` again and
  fetch the tool lists, through the database (``mcp_reloads``, polled every 2 s), and
  prints the report of the first process done. Conversations that start afterwards get
  the new tools; those already running keep theirs.
* ``serve [--stdio | --http [HOST:PORT]]`` offers one person's memory to another
  assistant (``gateway/mcp/person.py``), bound to them by a token: ``--stdio`` reads it
  from ``MNEMO_MCP_TOKEN``; ``--http`` (loopback ``127.0.0.1:8766`` by default) takes
  one per request as ``Authorization: Bearer``.
* ``token create --user PLATFORM:ID [--read-only] [--expires 30d]`` prints a new token
  once; ``token list [--json]``; ``token revoke ID``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings

T = TypeVar("T")
DEFAULT_HTTP = "127.0.0.1:8766"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="MCP: the servers the agent uses (list, reload); mnemo's memory as a server (serve, token)",
        description="MCP both ways: the tool servers of mcp.servers, and one person's memory served to "
        "another assistant.",
    )
    sub = parser.add_subparsers(dest="mcp_command", metavar="ACTION", required=True)

    ls = sub.add_parser("list", help="connect to every configured server now; show state and tools")
    ls.add_argument("--json", action="store_true", help="one JSON object")
    ls.set_defaults(handler=_list)

    reload = sub.add_parser("reload", help="make the running mnemo fetch the servers' tool lists again")
    reload.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="how long to wait for its report (default: connect timeout + 10 s)",
    )
    reload.set_defaults(handler=_reload)

    serve = sub.add_parser(
        "serve",
        help="offer one person's memory to another assistant over MCP",
        description="Serve the memory of the person a token is bound to. --stdio (default) reads the "
        "token from MNEMO_MCP_TOKEN; --http takes it from each request's Authorization: Bearer header.",
    )
    how = serve.add_mutually_exclusive_group()
    how.add_argument("--stdio", action="store_true", help="speak MCP on stdin/stdout (the default)")
    how.add_argument(
        "--http",
        nargs="?",
        const=DEFAULT_HTTP,
        metavar="HOST:PORT",
        help=f"streamable HTTP at http://HOST:PORT/mcp (default {DEFAULT_HTTP}; PORT alone: loopback)",
    )
    serve.set_defaults(handler=_serve)

    token = sub.add_parser("token", help="the tokens that bind an MCP client to one person")
    tsub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    create = tsub.add_parser("create", help="a new token (printed once)")
    create.add_argument("--user", required=True, metavar="PLATFORM:ID", help="the person it acts for")
    create.add_argument("--read-only", action="store_true", help="reading and searching only")
    create.add_argument("--expires", metavar="DURATION", help="e.g. 30d, 12h, 2w (default: never)")
    create.set_defaults(handler=_token_create)
    tls = tsub.add_parser("list", help="every token (never the tokens themselves)")
    tls.add_argument("--json", action="store_true", help="one JSON object per line")
    tls.set_defaults(handler=_token_list)
    revoke = tsub.add_parser("revoke", help="stop a token from working")
    revoke.add_argument("id", metavar="ID", help="the token's id (mnemo mcp token list), or the token")
    revoke.set_defaults(handler=_token_revoke)


def _with_repo(settings: Settings, fn: Callable[[Any, Any], Awaitable[T]]) -> T:
    """``fn(backend, repo)`` on the configured backend, closed afterwards."""
    from mnemo.gateway.storage import open_backend

    async def main() -> T:
        backend = await open_backend(settings)
        try:
            return await fn(backend, backend.mcp)
        finally:
            await backend.close()

    return asyncio.run(main())


def _stamp(epoch: float | None) -> str:
    return "never" if epoch is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


# --- the servers the agent uses --------------------------------------------------------


async def probe(settings: Settings) -> Any:
    """Connect to every configured server now (in parallel) and report: ``McpReport``."""
    from mnemo.gateway.mcp.catalog import server_tools
    from mnemo.gateway.mcp.connection import McpConnection, ServerState
    from mnemo.gateway.mcp.hub import McpReport, ServerReport
    from mnemo.gateway.turns.audience import describe

    cfg = settings.mcp
    conns = {
        name: McpConnection(
            name,
            server,
            connect_timeout_s=cfg.connect_timeout_s,
            probe_interval_s=cfg.probe_interval_s,
            log_dir=settings.home / "logs",
        )
        for name, server in cfg.servers.items()
    }
    try:
        await asyncio.gather(*(c.start() for c in conns.values()))
    finally:
        await asyncio.gather(*(c.stop() for c in conns.values()))
    reports = []
    for name, conn in conns.items():
        tools: tuple[str, ...] = ()
        warnings: tuple[str, ...] = ()
        if conn.state is ServerState.OK and conn.listed is not None:
            allow = None if conn.settings.tools == "all" else conn.settings.tools
            offered, warned = server_tools(name, conn.listed, allow)
            tools, warnings = tuple(t.name for t in offered), tuple(warned)
        reports.append(
            ServerReport(
                name,
                conn.settings.transport,
                conn.state.value,
                conn.error,
                describe(conn.settings.allowed),
                tools,
                warnings,
            )
        )
    return McpReport(tuple(reports))


def _need_sdk() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise CommandError("the MCP SDK is not installed: pip install 'mnemo[mcp]'", EXIT_USAGE) from None


def _list(args: argparse.Namespace, settings: Settings) -> int:
    if settings.mcp.servers:
        _need_sdk()
    report = asyncio.run(probe(settings))
    if args.json:
        print(json.dumps({"servers": [s.to_json() for s in report.servers]}, ensure_ascii=False))
    else:
        for line in report.lines():
            print(line)
        for server in report.servers:
            if server.tools:
                print(f"  {', '.join(server.tools)}")
    return EXIT_OK if all(s.state == "ok" for s in report.servers) else EXIT_REFUSED


def _reload(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.gateway.mcp.hub import RELOAD_POLL_S, McpReport
    from mnemo.gateway.storage import backend_for
    from mnemo.profile_lock import holder

    idle = False

    async def run(backend: Any, repo: Any) -> Any:
        nonlocal idle
        # Nothing serves the profile: give a process that does not announce itself (a
        # test's app) two polls to take it; otherwise wait for the servers' listings.
        idle = not (await backend_for(settings).serving(lambda: holder(settings.home))).running
        limit = args.timeout if args.timeout is not None else settings.mcp.connect_timeout_s + 10
        if idle and args.timeout is None:
            limit = 3 * RELOAD_POLL_S
        generation = await repo.request_reload(time.time())
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            state = await repo.reload_state(generation)
            if state is not None and state.report is not None:
                return state
            await asyncio.sleep(0.2)
        return None

    state = _with_repo(settings, run)
    if state is None:
        if idle:
            print("No mnemo is running on this profile: it fetches the tool lists when it starts.")
            return EXIT_OK
        raise CommandError("the running mnemo did not report in time (--timeout); see its log")
    report = McpReport.from_json(state.report)
    print(f"Reloaded by {state.done_by}; conversations that start now get these tools:")
    for line in report.lines():
        print(line)
    return EXIT_REFUSED if report.error else EXIT_OK


# --- mnemo's memory as a server ---------------------------------------------------------


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise CommandError(f"--http: {text!r} is not HOST:PORT (e.g. {DEFAULT_HTTP})", EXIT_USAGE) from None
    if not 0 <= number <= 65535:
        raise CommandError(f"--http: port {number} is out of range", EXIT_USAGE)
    return host, number


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    _need_sdk()
    http = _address(args.http) if args.http is not None else None
    token = settings.mcp.serve.token.get_secret_value() if settings.mcp.serve.token is not None else None
    if http is None and not token:
        raise CommandError(
            "--stdio needs the client's token in MNEMO_MCP_TOKEN (create one: mnemo mcp token create --user "
            "PLATFORM:ID)",
            EXIT_USAGE,
        )
    return asyncio.run(_serving(settings, token, http))


async def _serving(settings: Settings, token: str | None, http: tuple[str, int] | None) -> int:
    from mnemo.gateway.mcp.person import PersonMemory, SearchLimits
    from mnemo.gateway.mcp.server import http_app, is_loopback, serve_http, serve_stdio
    from mnemo.gateway.mcp.tokens import Tokens
    from mnemo.gateway.storage import open_backend
    from mnemo.gateway.turns.builtin_tools import search_view_settings
    from mnemo.gateway.turns.providers import open_providers

    backend = await open_backend(settings)
    providers = None
    try:
        providers = await open_providers(settings, backend.documents)
        providers.identities = backend.identities
        memory = PersonMemory(
            backend.files,
            backend.search,
            backend.mcp,
            home=settings.home,
            providers=providers,
            accounts=backend.links.members,
            limits=SearchLimits(
                settings.search.default_limit, settings.search.max_limit, search_view_settings(settings)
            ),
        )
        tokens = Tokens(backend.mcp)
        if http is None:
            assert token is not None
            if await tokens.verify(token) is None:
                raise CommandError("MNEMO_MCP_TOKEN is unknown, revoked or expired (mnemo mcp token list)")
            await serve_stdio(memory, tokens, token)
            return EXIT_OK
        host, port = http
        if not is_loopback(host):
            print(
                f"warning: serving on {host}, not loopback: put a TLS proxy in front, tokens travel in clear",
                file=sys.stderr,
            )
        app = http_app(memory, tokens, host=host, allowed_origins=settings.mcp.serve.allowed_origins)

        def started(bound: int) -> None:
            print(
                f"mnemo MCP server on http://{host}:{bound}/mcp (Ctrl-C stops it)",
                file=sys.stderr,
                flush=True,
            )

        await serve_http(app, host, port, started=started)
        return EXIT_OK
    finally:
        if providers is not None:
            await providers.shutdown()
        await backend.close()


# --- tokens ---------------------------------------------------------------------------


def _token_create(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.gateway.mcp.tokens import Tokens, parse_duration
    from mnemo.memory.errors import InvalidIdentifier
    from mnemo.memory.scope import UserRef

    try:
        user = UserRef.parse(args.user)
    except InvalidIdentifier as e:
        raise CommandError(f"--user: {e}", EXIT_USAGE) from None
    try:
        expires = parse_duration(args.expires) if args.expires else None
    except ValueError as e:
        raise CommandError(f"--expires: {e}", EXIT_USAGE) from None

    async def run(backend: Any, repo: Any) -> Any:
        return await Tokens(repo).create(user, read_only=args.read_only, expires_in_s=expires)

    new = _with_repo(settings, run)
    mode = "read-only" if new.row.read_only else "read and write"
    print(new.token)
    print(
        f"Token {new.row.id} for {user} ({mode}, expires {_stamp(new.row.expires_at)}). It is shown only "
        "now: give it to the MCP client (MNEMO_MCP_TOKEN for --stdio, Authorization: Bearer for --http)."
    )
    return EXIT_OK


def _token_list(args: argparse.Namespace, settings: Settings) -> int:
    async def run(backend: Any, repo: Any) -> Any:
        return await repo.tokens()

    rows = _with_repo(settings, run)
    now = time.time()
    if args.json:
        for r in rows:
            print(
                json.dumps(
                    {
                        "id": r.id,
                        "user": str(r.user),
                        "read_only": r.read_only,
                        "state": r.state(now),
                        "created_at": r.created_at,
                        "expires_at": r.expires_at,
                        "last_used_at": r.last_used_at,
                    }
                )
            )
        return EXIT_OK
    if not rows:
        print("No tokens. Create one: mnemo mcp token create --user PLATFORM:ID")
        return EXIT_OK
    print(f"{'ID':<14} {'USER':<24} {'MODE':<10} {'STATE':<8} {'EXPIRES':<17} LAST USED")
    for r in rows:
        mode = "read" if r.read_only else "read+write"
        print(
            f"{r.id:<14} {str(r.user):<24} {mode:<10} {r.state(now):<8} {_stamp(r.expires_at):<17} "
            f"{_stamp(r.last_used_at) if r.last_used_at else '—'}"
        )
    return EXIT_OK


def _token_revoke(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.gateway.mcp.tokens import Tokens

    async def run(backend: Any, repo: Any) -> str | None:
        return await Tokens(repo).revoke(args.id)

    revoked = _with_repo(settings, run)
    if revoked is None:
        raise CommandError("no active token has that id (mnemo mcp token list)")
    print(f"Revoked {revoked}: it is refused from the next request on.")
    return EXIT_OK
