"""The memory provider step of ``mnemo setup`` (and ``mnemo providers setup --activate``).

A provider's settings are checked against its schema, its availability (SDK installed,
key present) and — for a hosted or self-hosted one — whether its server answers, all
before anything is saved; then they are stored under ``providers/NAME/`` (secrets in
``secrets.json``, 0600) and ``memory.provider`` names it in config.yaml.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mnemo.cli.main import EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.gateway.config import Settings
from mnemo.memory.discovery import load_provider
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider_config import read_provider_config

if TYPE_CHECKING:
    from mnemo.cli.setup import Plan
    from mnemo.memory.provider import MemoryProvider

NONE = "none"


def parse_sets(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--set expects KEY=VALUE, got {pair!r}", EXIT_USAGE)
        out[key.strip()] = value
    return out


def provider(settings: Settings, name: str) -> MemoryProvider:
    try:
        return load_provider(name, settings.home)
    except ProviderError as e:
        raise CommandError(str(e), EXIT_USAGE) from None


def checked_values(settings: Settings, name: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The stored settings with ``given`` applied, each parsed by the schema."""
    schema = tuple(provider(settings, name).get_config_schema())
    fields = {f.key: f for f in schema}
    unknown = sorted(set(given) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields)) or "none"
        raise CommandError(
            f"{name}: unknown setting(s) {', '.join(unknown)} (allowed: {allowed})", EXIT_USAGE
        )
    values = {k: v for k, v in read_provider_config(settings.home, name, schema).items() if k in fields}
    try:
        for key, raw in given.items():
            values[key] = fields[key].parse(raw) if isinstance(raw, str) else raw
    except ProviderError as e:
        raise CommandError(f"{name}: {e}", EXIT_USAGE) from None
    missing = [f.key for f in schema if f.required and values.get(f.key) in (None, "")]
    if missing:
        raise CommandError(f"{name}: {', '.join(missing)} required (--set {missing[0]}=…)", EXIT_USAGE)
    return values


async def reachable(settings: Settings, name: str, values: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the provider's server answers (any status below 500): its ``base_url``
    setting, else ``<NAME>_BASE_URL``, else its hosted API. A local provider is."""
    from mnemo.cli.doctor import PROVIDER_HOSTED_URLS
    from mnemo.cli.provider_status import BUILTIN_LOCAL

    if name in BUILTIN_LOCAL:
        return True, f"{name} is local (kept in this profile)"
    base = str(
        values.get("base_url")
        or os.environ.get(f"{name.upper()}_BASE_URL")
        or PROVIDER_HOSTED_URLS.get(name, "")
    ).rstrip("/")
    if not base:
        return True, f"{name}: no server address to check"
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            async with http.get(f"{base}/") as resp:
                status = resp.status
    except (aiohttp.ClientError, TimeoutError) as e:
        return False, f"{name} at {base} is unreachable: {e or type(e).__name__}"
    if status >= 500:
        return False, f"{name} at {base} answers HTTP {status} (down)"
    return True, f"{name} at {base} answers (HTTP {status})"


def plan_provider(plan: Plan, settings: Settings, name: str, pairs: list[str]) -> None:
    from mnemo.cli.setup_checks import Verdict

    if name == NONE:
        plan.config["memory.provider"] = None
        return
    values = checked_values(settings, name, parse_sets(pairs))
    check_available(settings, name, values)
    ok, detail = asyncio.run(reachable(settings, name, values))
    plan.checked("provider", Verdict(ok, detail))
    if not ok:
        raise CommandError(f"provider: {detail} — nothing was saved", EXIT_REFUSED)
    plan.provider = (name, values)
    plan.config["memory.provider"] = name


def check_available(settings: Settings, name: str, values: Mapping[str, Any]) -> None:
    availability = provider(settings, name).is_available(settings.home, values)
    if not availability.ok:
        raise CommandError(f"{name} cannot run here: {availability.reason} — nothing was saved", EXIT_REFUSED)


def save_provider(settings: Settings, name: str, values: Mapping[str, Any]) -> None:
    try:
        provider(settings, name).save_config(values, settings.home)
    except ProviderError as e:
        raise CommandError(f"{name}: {e}", EXIT_USAGE) from None
