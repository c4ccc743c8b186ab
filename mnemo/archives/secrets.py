"""What an archive leaves out: every secret, wherever it sits.

* whole files: ``.env``, ``admin_token`` (the dashboard's token), every provider's
  ``secrets.json`` — never archived;
* ``config.yaml``: the archived copy is the file rebuilt from its parsed settings with
  each secret value replaced by ``MARKER`` — every ``SecretStr`` setting
  (``llm.api_key``, ``telegram.bot_token``, ``telegram.webhook_secret``,
  ``discord.bot_token``, ``web.access_token``, ``web.admin_token``, ``database.url``,
  ``transcription.api_key``) and any other key named like a secret (``token``,
  ``secret``, ``password``, ``api_key``, …). A restore drops the markers again (the
  target keeps its own values) and keeps the target's ``database`` section;
* a provider's ``config.json``: fields its schema marks secret (mnemo keeps them in
  ``secrets.json``; an older file may still hold one);
* anywhere else — a message, a memory entry, a skill, a job's payload — the value of
  any configured secret (8 characters or more) is replaced by ``MARKER``.

``Secrets.lines()`` says exactly what was left out; export prints it and the manifest
keeps it (names only, never a value).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, SecretStr

from mnemo.gateway.config import ENV_KEYS, Settings, read_dotenv

MARKER = "[secret left out by mnemo export]"
MIN_SECRET_CHARS = 8  # shorter values would be replaced in ordinary text
# A key named like a secret: ``bot_token``, ``webhook_secret``, ``api_key`` — a whole
# word of the name, so ``max_tokens`` or ``tail_token_ratio`` are no secrets.
SECRET_NAME = re.compile(
    r"(?:^|[_-])(?:token|secret|password|passwd|apikey|api[_-]key|private[_-]key|credentials?)$",
    re.IGNORECASE,
)
FILES = (".env", "admin_token")


def _secret_annotation(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in getattr(annotation, "__args__", ())


def secret_settings(model: type[BaseModel] = Settings, prefix: str = "") -> set[str]:
    """Every dotted setting whose value is a ``SecretStr``."""
    out: set[str] = set()
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if _secret_annotation(annotation):
            out.add(prefix + name)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out |= secret_settings(annotation, f"{prefix}{name}.")
    return out


SECRET_SETTINGS = frozenset(secret_settings())


def is_secret_key(dotted: str) -> bool:
    return dotted in SECRET_SETTINGS or SECRET_NAME.search(dotted.rsplit(".", 1)[-1]) is not None


@dataclass
class Secrets:
    """The secrets of one profile: their values (to replace) and what was left out."""

    values: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # files and settings, by name
    replaced: dict[str, int] = field(default_factory=dict)  # member -> occurrences replaced

    def lines(self) -> list[str]:
        out = list(self.left_out)
        for member, n in sorted(self.replaced.items()):
            out.append(f"{n} occurrence{'s' if n != 1 else ''} of a configured secret in {member}")
        return out

    def scrub(self, data: bytes) -> tuple[bytes, int]:
        """``data`` with every secret value replaced by the marker; how many were."""
        n = 0
        for value in self.values:
            needle = value.encode("utf-8")
            if needle in data:
                n += data.count(needle)
                data = data.replace(needle, MARKER.encode("utf-8"))
        return data, n


def collect(settings: Settings) -> Secrets:
    """The profile's secret values (settings, ``.env``, ``admin_token``, providers'
    ``secrets.json``) and the secret files present, longest value first."""
    found: set[str] = set()
    left: list[str] = []
    home = settings.home

    def take(value: object) -> None:
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, str) and len(value.strip()) >= MIN_SECRET_CHARS:
            found.add(value.strip())
            if "://" in value:  # a URL's password on its own, too
                password = urlsplit(value.strip()).password
                if password:
                    take(password)

    for dotted in SECRET_SETTINGS:
        node: Any = settings
        for part in dotted.split("."):
            node = getattr(node, part, None)
        take(node)
    dotenv = home / ".env"
    if dotenv.is_file():
        left.append(".env (every line)")
        for name, value in read_dotenv(dotenv).items():
            if is_secret_key(ENV_KEYS.get(name, name)):
                take(value)
    token = home / "admin_token"
    if token.is_file():
        left.append("admin_token (the dashboard's sign-in token)")
        take(token.read_text(encoding="utf-8", errors="replace"))
    providers = settings.providers_dir
    if providers.is_dir():
        import json

        for path in sorted(providers.glob("*/secrets.json")):
            left.append(f"providers/{path.parent.name}/secrets.json")
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            for value in data.values() if isinstance(data, dict) else ():
                take(value)
    return Secrets(sorted(found, key=len, reverse=True), left)


def _walk(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(dotted key, its mapping, its key) of every scalar under ``tree`` (lists by index)."""
    items: list[tuple[Any, Any]] = (
        list(tree.items())
        if isinstance(tree, dict)
        else list(enumerate(tree))
        if isinstance(tree, list)
        else []
    )
    for key, value in items:
        dotted = f"{prefix}{key}"
        if isinstance(value, dict | list):
            yield from _walk(value, dotted + ".")
        else:
            yield dotted, tree, key


def redact_config(text: str, secrets: Secrets) -> str | None:
    """``config.yaml`` rebuilt with every secret replaced by ``MARKER`` (names added to
    ``secrets.left_out``); None (left out whole) when it is not a YAML mapping."""
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError:
        secrets.left_out.append("config.yaml (not valid YAML, so its secrets cannot be told apart)")
        return None
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        secrets.left_out.append("config.yaml (not a mapping of settings)")
        return None
    for dotted, parent, key in list(_walk(tree)):
        value = parent[key]
        if value is None or value == "" or not is_secret_key(dotted):
            continue
        parent[key] = MARKER
        if f"config.yaml: {dotted}" not in secrets.left_out:
            secrets.left_out.append(f"config.yaml: {dotted}")
    body = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
    out, _ = secrets.scrub(body.encode("utf-8"))  # a secret pasted into another setting
    return out.decode("utf-8")


def restored_config(archived: str, current: str | None) -> str:
    """The ``config.yaml`` a restore writes: the archive's without its markers (and
    without its ``database`` section: the target decides where its data lives), plus
    the target's own values for what was left out and the target's ``database``."""
    tree = yaml.safe_load(archived) or {}
    mine: dict[str, Any] = {}
    if current is not None:
        try:
            loaded = yaml.safe_load(current)
        except yaml.YAMLError:
            loaded = None
        mine = loaded if isinstance(loaded, dict) else {}
    tree.pop("database", None)
    for dotted, parent, key in list(_walk(tree)):
        if parent[key] != MARKER:
            continue
        kept = _get(mine, dotted)
        if kept is not None:
            parent[key] = kept
        elif isinstance(parent, dict):
            del parent[key]
        else:
            parent[key] = None
    for section in [k for k, v in tree.items() if v == {}]:
        del tree[section]  # a section that held only secrets
    if "database" in mine:
        tree["database"] = mine["database"]
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)


def _get(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def redact_provider_config(
    data: dict[str, Any], secret_fields: set[str], name: str, secrets: Secrets
) -> dict[str, Any]:
    """A provider's ``config.json`` without the fields its schema marks secret."""
    out = {}
    for key, value in data.items():
        if key in secret_fields or SECRET_NAME.search(key):
            secrets.left_out.append(f"providers/{name}/config.json: {key}")
            continue
        out[key] = value
    return out


def is_secret_file(path: Path) -> bool:
    return path.name in FILES or path.name == "secrets.json"
