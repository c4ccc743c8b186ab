"""``mnemo pair``: the operator's side of pairing (the same store as ``/pair``).

mnemo pair list
mnemo pair approve CODE
mnemo pair deny CODE
mnemo pair revoke PLATFORM:ID
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, CommandError
from mnemo.gateway.config import Settings
from mnemo.gateway.storage import open_backend
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.scope import UserRef


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pair", help="list, approve or deny pairing requests of unknown users")
    actions = p.add_subparsers(dest="pair_action", metavar="ACTION", required=True)
    ls = actions.add_parser("list", help="pending requests (codes expire after an hour)")
    ls.add_argument(
        "--json", action="store_true", help="print a JSON list of {code, user, user_name, created_at}"
    )
    for name in ("approve", "deny"):
        a = actions.add_parser(name, help=f"{name} a pending request")
        a.add_argument("code")
    r = actions.add_parser("revoke", help="withdraw an approved user's access")
    r.add_argument("user", metavar="PLATFORM:ID")
    p.set_defaults(handler=run)


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    backend = await open_backend(settings)  # state.db, or database.url's PostgreSQL
    try:
        store = backend.pairings
        if args.pair_action == "list":
            pending = await store.pending()
            if args.json:
                rows = [
                    {
                        "code": p.code,
                        "user": str(p.user),
                        "user_name": p.user_name,
                        "created_at": datetime.fromtimestamp(p.created_at, UTC).isoformat(),
                    }
                    for p in pending
                ]
                print(json.dumps(rows, ensure_ascii=False, indent=2))
                return EXIT_OK
            for p in pending:
                print(f"{p.code}  {p.user}  {p.user_name}".rstrip())
            if not pending:
                print("no pending pairing requests")
            return EXIT_OK
        if args.pair_action in ("approve", "deny"):
            decided = await store.decide(args.code, args.pair_action == "approve", by="cli")
            if decided is None:
                print(f"no pending request with code {args.code} (codes expire after an hour)")
                return EXIT_REFUSED
            print(f"{decided.state} {decided.user} {decided.user_name}".rstrip())
            return EXIT_OK
        try:
            user = UserRef.parse(args.user)
        except InvalidIdentifier as e:
            raise CommandError(f"revoke: {e}", code=2) from None
        if await store.revoke(user):
            print(f"revoked {user}")
            return EXIT_OK
        print(f"{user} was not paired")
        return EXIT_REFUSED
    finally:
        await backend.close()


def run(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_run(args, settings))
