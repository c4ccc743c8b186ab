"""``mnemo providers list --json`` and ``mnemo providers status [--json]``.

``list`` names every provider of the design documents (and any other one found):
``installed`` (registered and its SDK extra present), ``configured`` (settings stored
under ``providers/<name>/`` or its API key in the environment), ``available`` (it could
run here now, ``reason`` when not).

``status`` shows the active provider (``memory.provider``): reachable or not and the
last error as the running gateway last recorded them (``providers/<name>/status.json``),
and its queued/failed writes (job kind ``provider_write`` in the job table).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
from typing import Any

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED
from mnemo.gateway.config import Settings
from mnemo.memory.discovery import discover
from mnemo.memory.durable import read_status
from mnemo.memory.provider_config import CONFIG_FILE, SECRETS_FILE

# name → (the SDK module its extra installs, or None; the env var holding its key)
KNOWN_PROVIDERS: dict[str, tuple[str | None, str | None]] = {
    "holographic": (None, None),
    "honcho": ("honcho", "HONCHO_API_KEY"),
    "mem0": ("mem0", "MEM0_API_KEY"),
    "hindsight": ("hindsight_client", "HINDSIGHT_API_KEY"),
    "supermemory": ("supermemory", "SUPERMEMORY_API_KEY"),
    "retaindb": (None, "RETAINDB_API_KEY"),
    "byterover": (None, "BYTEROVER_API_KEY"),
    "openviking": ("openviking_sdk", "OPENVIKING_API_KEY"),
}
BUILTIN_LOCAL = {"holographic"}  # needs no settings
PROVIDER_WRITE = "provider_write"


def provider_rows(settings: Settings) -> list[dict[str, Any]]:
    infos = {i.name: i for i in discover(settings.home)}
    rows = []
    for name in dict.fromkeys([*KNOWN_PROVIDERS, *infos]):
        info = infos.get(name)
        module, env = KNOWN_PROVIDERS.get(name, (None, None))
        sdk = module is None or importlib.util.find_spec(module) is not None
        folder = settings.home / "providers" / name
        configured = (
            name in BUILTIN_LOCAL
            or (folder / CONFIG_FILE).is_file()
            or (folder / SECRETS_FILE).is_file()
            or bool(env and os.environ.get(env))
        )
        installed = info is not None and info.factory is not None and sdk
        reason = "" if info is None or info.available else info.reason
        if info is None:
            reason = "not installed (no provider registered under this name)"
        rows.append(
            {
                "name": name,
                "description": info.description if info else "",
                "installed": installed,
                "configured": configured,
                "available": bool(info and info.available and installed),
                "reason": reason,
                "active": settings.memory.provider == name,
            }
        )
    return rows


def list_json(settings: Settings) -> int:
    print(json.dumps({"active": settings.memory.provider, "providers": provider_rows(settings)}, indent=2))
    return EXIT_OK


async def write_counts(settings: Settings, name: str) -> dict[str, Any]:
    """Queued/failed/done writes of provider ``name`` and the last write error (also
    shown by ``mnemo doctor``)."""
    from mnemo.gateway.storage import open_backend

    backend = await open_backend(settings)
    try:
        jobs = [j for j in await backend.jobs.find(kind=PROVIDER_WRITE) if j.payload.get("provider") == name]
    finally:
        await backend.close()
    failed = [j for j in jobs if j.state == "failed"]
    return {
        "queued_writes": sum(1 for j in jobs if j.state in ("queued", "running")),
        "failed_writes": len(failed),
        "done_writes": sum(1 for j in jobs if j.state == "done"),
        "last_write_error": (
            failed[-1].error if failed else next((j.error for j in reversed(jobs) if j.error), None)
        )
        or "",
    }


def status(args: argparse.Namespace, settings: Settings) -> int:
    name = settings.memory.provider
    body: dict[str, Any] = {"provider": name}
    if name:
        row = next((r for r in provider_rows(settings) if r["name"] == name), None)
        recorded = read_status(settings.home / "providers" / name)
        body.update(
            installed=bool(row and row["installed"]),
            configured=bool(row and row["configured"]),
            available=bool(row and row["available"]),
            reason=row["reason"] if row else "",
            reachable=recorded.get("reachable"),
            last_error=recorded.get("last_error") or "",
        )
        body.update(asyncio.run(write_counts(settings, name)))
    if getattr(args, "json", False):
        print(json.dumps(body, indent=2))
    elif not name:
        print("no external memory provider is active (set memory.provider in config.yaml)")
    else:
        reach = {True: "reachable", False: "unreachable", None: "not contacted yet"}[body["reachable"]]
        print(f"provider: {name} ({'available' if body['available'] else 'unavailable: ' + body['reason']})")
        print(f"  {reach}" + (f"; last error: {body['last_error']}" if body["last_error"] else ""))
        print(
            f"  writes: {body['queued_writes']} queued, {body['failed_writes']} failed, {body['done_writes']} done"
        )
        if body["last_write_error"]:
            print(f"  last write error: {body['last_write_error']}")
    if name and not body["available"]:
        return EXIT_REFUSED
    return EXIT_OK
