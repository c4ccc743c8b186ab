"""The two files ``mnemo setup`` writes, edited in place: never clobbered.

* ``config.yaml`` — behaviour. The wizard sets only the keys it asked about; every
  other section and key stays as it was. PyYAML keeps no comments, so when the file
  changes, the previous version is kept beside it as ``config.yaml.bak``.
* ``.env`` — secrets, mode 0600. A variable the wizard sets replaces its own line in
  place; comments, other variables and their order are kept.

Both are written atomically (temp file, fsync, rename) and the result is validated
with the same loader ``mnemo`` uses: a change that would make the profile invalid is
undone and reported, so re-running setup cannot leave a broken profile behind.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mnemo.gateway.config import Settings, load_settings
from mnemo.gateway.errors import ConfigError
from mnemo.memory.atomic import ensure_folder, replace_file

_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")


@dataclass(frozen=True, slots=True)
class Changes:
    """What one run changed: dotted config keys and env variable names (never values)."""

    config: tuple[str, ...]
    env: tuple[str, ...]
    backup: Path | None  # the previous config.yaml, kept when it changed


def read_config(home: Path) -> dict[str, Any]:
    path = home / "config.yaml"
    if not path.exists():
        return {}
    loaded = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return loaded


def get_dotted(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = value


def read_env(home: Path) -> list[str]:
    path = home / ".env"
    return path.read_text(encoding="utf-8-sig").splitlines() if path.exists() else []


def env_value(lines: list[str], name: str) -> str | None:
    """The value a ``KEY=value`` line gives ``name`` (quotes removed), or None."""
    for line in reversed(lines):
        m = _ENV_LINE.match(line)
        if m and m.group(1) == name:
            value = line.split("=", 1)[1].strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                return value[1:-1]
            return value.split(" #", 1)[0].rstrip()
    return None


def _env_edit(lines: list[str], values: Mapping[str, str]) -> list[str]:
    out = list(lines)
    for name, value in values.items():
        line = f"{name}={_quoted(value)}"
        at = [i for i, old in enumerate(out) if (m := _ENV_LINE.match(old)) and m.group(1) == name]
        if at:
            out[at[-1]] = line
            for i in reversed(at[:-1]):  # an earlier duplicate would be overridden anyway
                del out[i]
        else:
            out.append(line)
    return out


def _quoted(value: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_./:@+-]*", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def apply(
    home: Path,
    config: Mapping[str, Any],
    env: Mapping[str, str],
    *,
    environ: Mapping[str, str] | None = None,
) -> tuple[Settings, Changes]:
    """Write ``config`` (dotted key → value) into config.yaml and ``env`` into .env,
    then load the profile. Raises ``ConfigError`` (with both files as they were) when
    the result is invalid."""
    ensure_folder(home)
    tree = read_config(home)
    changed = tuple(k for k, v in config.items() if get_dotted(tree, k) != v)
    for key in changed:
        _set_dotted(tree, key, config[key])
    lines = read_env(home)
    env_changed = tuple(k for k, v in env.items() if env_value(lines, k) != v)
    cfg_path, env_path = home / "config.yaml", home / ".env"
    old_cfg = cfg_path.read_bytes() if cfg_path.exists() else None
    old_env = env_path.read_bytes() if env_path.exists() else None
    backup = None
    if changed:
        if old_cfg is not None:
            backup = cfg_path.with_name("config.yaml.bak")
            shutil.copyfile(cfg_path, backup)
            os.chmod(backup, 0o600)
        text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True, default_flow_style=False)
        replace_file(cfg_path, text.encode("utf-8"))
    if env_changed or (old_env is None and env):
        replace_file(env_path, ("\n".join(_env_edit(lines, env)) + "\n").encode("utf-8"))
    if env_path.exists():
        os.chmod(env_path, 0o600)  # secrets: readable by this user only, also when it existed
    try:
        settings = load_settings(home, environ=environ)
    except ConfigError:
        _restore(cfg_path, old_cfg)
        _restore(env_path, old_env)
        raise
    return settings, Changes(changed, env_changed, backup)


def _restore(path: Path, old: bytes | None) -> None:
    if old is None:
        path.unlink(missing_ok=True)
    else:
        replace_file(path, old)
