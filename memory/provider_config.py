"""Provider settings: the schema a provider declares and where its values live.

``config.yaml`` has no per-provider section (``memory.provider`` only names the active
one), so each provider's settings live in its own folder::

    $MNEMO_HOME/providers/<name>/config.json    ordinary settings (exported)
    $MNEMO_HOME/providers/<name>/secrets.json   fields marked secret, mode 0600,
                                                never exported

Both are written atomically (temp file, fsync, rename). ``read_provider_config``
merges them; schema defaults fill what is missing.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from mnemo.memory.atomic import ensure_folder
from mnemo.memory.errors import ProviderError
from mnemo.memory.scope import validate_id

CONFIG_FILE = "config.json"
SECRETS_FILE = "secrets.json"

Value = str | int | float | bool


class ConfigKind(StrEnum):
    STRING = "string"
    INTEGER = "integer"
    NUMBER = "number"
    BOOLEAN = "boolean"
    CHOICE = "choice"


_TRUE = {"1", "true", "yes", "y", "on"}
_FALSE = {"0", "false", "no", "n", "off"}


@dataclass(frozen=True, slots=True)
class ConfigField:
    key: str
    description: str
    kind: ConfigKind = ConfigKind.STRING
    default: Value | None = None
    required: bool = False
    secret: bool = False
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    def parse(self, raw: Any) -> Value:
        """Turn a typed value or its text form (from ``--set`` or a prompt) into the
        field's type; raise ``ProviderError`` naming the field."""
        try:
            value = self._convert(raw)
        except (TypeError, ValueError) as e:
            raise ProviderError(f"{self.key}: {e}") from None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.minimum is not None and value < self.minimum:
                raise ProviderError(f"{self.key}: {value} is below the minimum {self.minimum:g}")
            if self.maximum is not None and value > self.maximum:
                raise ProviderError(f"{self.key}: {value} is above the maximum {self.maximum:g}")
        return value

    def _convert(self, raw: Any) -> Value:
        text = raw.strip() if isinstance(raw, str) else raw
        match self.kind:
            case ConfigKind.BOOLEAN:
                if isinstance(text, bool):
                    return text
                if isinstance(text, str) and text.lower() in _TRUE | _FALSE:
                    return text.lower() in _TRUE
                raise ValueError(f"expected yes/no, got {raw!r}")
            case ConfigKind.INTEGER:
                if isinstance(text, bool) or (isinstance(text, float) and not text.is_integer()):
                    raise ValueError(f"expected an integer, got {raw!r}")
                try:
                    return int(text)
                except (TypeError, ValueError):
                    raise ValueError(f"expected an integer, got {raw!r}") from None
            case ConfigKind.NUMBER:
                if isinstance(text, bool):
                    raise ValueError(f"expected a number, got {raw!r}")
                try:
                    return float(text)
                except (TypeError, ValueError):
                    raise ValueError(f"expected a number, got {raw!r}") from None
            case ConfigKind.CHOICE:
                if text not in self.choices:
                    raise ValueError(f"{raw!r} is not allowed (allowed: {', '.join(self.choices)})")
                return str(text)
            case _:
                if not isinstance(text, str):
                    raise ValueError(f"expected text, got {raw!r}")
                return text


def provider_dir(home: Path, name: str) -> Path:
    return Path(home) / "providers" / validate_id("provider", name)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProviderError(f"{path}: cannot read provider settings: {e}") from e
    if not isinstance(data, dict):
        raise ProviderError(f"{path}: expected a JSON object")
    return data


def read_provider_config(home: Path, name: str, schema: Sequence[ConfigField] = ()) -> dict[str, Any]:
    """The stored settings of provider ``name``, with schema defaults filled in."""
    folder = provider_dir(home, name)
    values: dict[str, Any] = {f.key: f.default for f in schema if f.default is not None}
    values.update(_read_json(folder / CONFIG_FILE))
    values.update(_read_json(folder / SECRETS_FILE))
    return values


def _write_atomic(path: Path, data: Mapping[str, Any], mode: int) -> None:
    ensure_folder(path.parent)  # providers/ and providers/<name>/: 0700, like every profile folder
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dict(data), f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_provider_config(
    home: Path, name: str, schema: Sequence[ConfigField], values: Mapping[str, Any]
) -> Path:
    """Validate ``values`` (unknown keys and missing required fields are errors) and
    store them; returns the path of ``config.json``."""
    fields = {f.key: f for f in schema}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields)) or "none"
        raise ProviderError(f"{name}: unknown setting(s) {', '.join(unknown)} (allowed: {allowed})")
    parsed = {k: fields[k].parse(v) for k, v in values.items()}
    missing = [f.key for f in schema if f.required and f.key not in parsed and f.default is None]
    if missing:
        raise ProviderError(f"{name}: required setting(s) missing: {', '.join(missing)}")
    folder = provider_dir(home, name)
    public = {k: v for k, v in parsed.items() if not fields[k].secret}
    secret = {k: v for k, v in parsed.items() if fields[k].secret}
    _write_atomic(folder / CONFIG_FILE, public, 0o600)  # profile files are private, secrets or not
    if secret:
        _write_atomic(folder / SECRETS_FILE, secret, 0o600)
    return folder / CONFIG_FILE
