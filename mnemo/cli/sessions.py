"""``mnemo sessions``: list, show, search and import stored conversations.

``import`` goes through the same write path as the gateway (``SessionStore``), one
transaction per session. ``search`` without ``--chat`` searches every chat: this is the
operator's own database; the bot's tool is always scoped to the caller's chat.

Every action opens the configured backend (``open_backend``): ``state.db``, or the
PostgreSQL server of ``database.url``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

from mnemo.cli.main import EXIT_OK, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.gateway.search_display import conversations, render_text
from mnemo.gateway.storage import StorageBackend, open_backend
from mnemo.memory.dataset import import_dataset, load_dataset
from mnemo.memory.errors import InvalidDataset, StoreError
from mnemo.memory.search import result_to_json
from mnemo.memory.sessions import MessageRow, SessionRow

T = TypeVar("T")
LARGE_IMPORT = 2000  # messages; above this, progress goes to stderr


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sessions",
        help="list, show, search and import stored conversations",
        description="Work with the session store ($MNEMO_HOME/state.db, or database.url's PostgreSQL).",
    )
    sub = parser.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)

    ls = sub.add_parser("list", help="recent sessions, newest first")
    ls.add_argument("--chat", metavar="KEY", help="only this chat (session key)")
    ls.add_argument("--limit", type=int, default=20, metavar="N")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(handler=_list)

    show = sub.add_parser("show", help="print one session's messages")
    show.add_argument("session_id", metavar="SESSION_ID")
    show.add_argument("--json", action="store_true", help="print {session, messages} as one JSON object")
    show.set_defaults(handler=_show)

    search = sub.add_parser("search", help="full-text search of earlier messages")
    search.add_argument("query", metavar="QUERY")
    search.add_argument("--chat", metavar="KEY", action="append", help="restrict to this chat (repeatable)")
    search.add_argument("--limit", type=int, default=10, metavar="N")
    search.add_argument("--json", action="store_true", help="print the result as JSON")
    search.set_defaults(handler=_search)

    imp = sub.add_parser("import", help="import a chat in the neutral dataset format")
    imp.add_argument("file", metavar="FILE", type=Path)
    imp.add_argument("--chat", metavar="KEY", help="chat to import into (default: import:<file name>)")
    imp.set_defaults(handler=_import)


def _run(settings: Settings, body: Callable[[StorageBackend], Awaitable[T]]) -> T:
    async def main() -> T:
        try:
            backend = await open_backend(settings)
        except StoreError as e:
            raise CommandError(str(e)) from e
        try:
            return await body(backend)
        except StoreError as e:
            raise CommandError(str(e)) from e
        finally:
            await backend.close()

    return asyncio.run(main())


def _session_line(s: SessionRow) -> str:
    state = f"ended ({s.end_reason})" if s.is_ended else "active"
    title = f"  {s.title}" if s.title else ""
    return (
        f"{s.id}  {s.started_at:%Y-%m-%d %H:%M}  {s.chat_key}  {s.source}  "
        f"{s.message_count} msgs  {state}  ${s.estimated_cost_usd:.4f}{title}"
    )


def _session_json(s: SessionRow) -> dict[str, Any]:
    return {
        "id": s.id,
        "chat_key": s.chat_key,
        "source": s.source,
        "started_at": s.started_at.isoformat(),
        "ended_at": s.ended_at and s.ended_at.isoformat(),
        "end_reason": s.end_reason,
        "message_count": s.message_count,
        "title": s.title,
    }


def _message_json(m: MessageRow) -> dict[str, Any]:
    return {
        "id": m.id,
        "role": str(m.role),
        "author_id": m.author_id,
        "author_name": m.author_name,
        "created_at": m.created_at.isoformat(),
        "content": m.content,
        "tool_calls": [c.to_json() for c in m.tool_calls],
        "tool_name": m.tool_name,
        "is_error": m.is_error,
    }


def _list(args: argparse.Namespace, settings: Settings) -> int:
    if args.limit < 1:
        raise CommandError("--limit must be at least 1", EXIT_USAGE)
    from mnemo.adapters.terminal import printable

    rows = _run(settings, lambda b: b.sessions.list_sessions(args.chat, limit=args.limit))
    for s in rows:
        if args.json:
            print(json.dumps(_session_json(s)))
        else:
            print(printable(_session_line(s)))
    if not rows and not args.json:
        print("no sessions", file=sys.stderr)
    return EXIT_OK


def _show(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.adapters.terminal import printable

    async def body(backend: StorageBackend) -> int:
        store = backend.sessions
        session = await store.get_session(args.session_id)
        if session is None:
            raise CommandError(f"no session {args.session_id!r}")
        if args.json:
            from mnemo.adapters.terminal import printable_json

            rows = await store.load_messages(session.id)
            body = {"session": _session_json(session), "messages": [_message_json(m) for m in rows]}
            print(printable_json(json.dumps(body, ensure_ascii=False, indent=2)))
            return EXIT_OK
        print(printable(_session_line(session)))
        for m in await store.load_messages(session.id):
            who = m.author_name or m.role
            calls = "".join(f" [tool call {c.name}]" for c in m.tool_calls)
            print(printable(f"[{m.created_at:%Y-%m-%d %H:%M:%S}] #{m.id} {who}: {m.content}{calls}"))
        return EXIT_OK

    return _run(settings, body)


def _search(args: argparse.Namespace, settings: Settings) -> int:
    if args.limit < 1:
        raise CommandError("--limit must be at least 1", EXIT_USAGE)
    if not args.query.strip():
        raise CommandError("the search query is empty", EXIT_USAGE)
    from mnemo.adapters.terminal import printable, printable_json

    async def body(backend: StorageBackend) -> int:
        keys = list(args.chat) if args.chat else await backend.directory.chats()
        searcher = backend.make_lexical_search()  # no embedding model for a shell search
        result = await searcher.search(args.query, chat_keys=keys, limit=args.limit)
        if args.json:
            print(
                printable_json(
                    json.dumps(
                        {"query": args.query, "count": len(result.hits), "results": result_to_json(result)},
                        ensure_ascii=False,
                    )
                )
            )
            return EXIT_OK
        found = conversations(result)
        if not found:
            print("no matches", file=sys.stderr)
            return EXIT_OK
        print(printable(render_text(found, tz=ZoneInfo(settings.gateway.timezone), with_keys=True)))
        return EXIT_OK

    return _run(settings, body)


class Progress:
    """A progress line on stderr: redrawn in a terminal, every 10% otherwise."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._tty = sys.stderr.isatty()
        self._last_decile = -1

    def __call__(self, done: int, total: int) -> None:
        frac = done / total if total else 1.0
        if self._tty:
            bar = "#" * int(frac * 30)
            end = "\n" if done >= total else ""
            print(
                f"\r{self._label} [{bar:<30}] {done}/{total} messages", end=end, file=sys.stderr, flush=True
            )
        elif int(frac * 10) > self._last_decile:
            self._last_decile = int(frac * 10)
            print(f"{self._label}: {done}/{total} messages", file=sys.stderr, flush=True)


def _import(args: argparse.Namespace, settings: Settings) -> int:
    try:
        dataset = load_dataset(args.file)
    except InvalidDataset as e:
        raise CommandError(str(e), EXIT_USAGE) from e
    chat_key = args.chat or f"import:{dataset.name}"
    progress = Progress(f"importing {args.file.name}") if dataset.message_count >= LARGE_IMPORT else None

    async def body(backend: StorageBackend) -> int:
        report = await import_dataset(backend.sessions, dataset, chat_key, progress=progress)
        print(f"imported {report.sessions} sessions, {report.messages} messages into chat {chat_key}")
        return EXIT_OK

    return _run(settings, body)
