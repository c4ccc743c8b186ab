"""The SKILL.md format and the rules for the files next to it.

A skill is a folder whose ``SKILL.md`` starts with YAML front matter (the public
agent-skills convention, so existing skill folders install unchanged)::

    ---
    name: deploy-docs            # [a-z0-9-], at most 64 chars, equal to the folder name
    description: One line, at most 1,024 chars.
    category: devops             # optional
    platforms: [cli, telegram]   # optional: cli, telegram, discord, web, cron
    tags: [docs]                 # optional
    version: 1.0                 # optional
    mcp_tools: [github__create_issue]   # optional: MCP tools (SERVER__TOOL) it needs
    ---
    body ...

A skill naming ``mcp_tools`` is shown in the index as unavailable to a person for whom
any of them is not configured (``mcp.servers``: the server, its tool allowlist, who may
use it); it can still be read.

Supporting files live only in ``references/``, ``templates/``, ``scripts/`` and
``assets/``; nothing in a skill is ever executed (``scripts/`` is text to read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

import yaml

from mnemo.memory.errors import MemoryRefused

MAX_SKILL_CHARS = 20_000
MAX_FILE_CHARS = 100_000
MAX_NAME_LEN = 64
MAX_DESCRIPTION_LEN = 1_024
SUBFOLDERS = ("references", "templates", "scripts", "assets")
PLATFORMS = frozenset({"cli", "telegram", "discord", "web", "cron"})
SKILL_FILE = "SKILL.md"

_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_CATEGORY = re.compile(r"[a-z0-9][a-z0-9_-]*")
# An MCP tool as the model sees it (``gateway/mcp/catalog.py``): SERVER__TOOL.
_MCP_TOOL = re.compile(r"[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*__[A-Za-z0-9_-]+")


class SkillRefused(MemoryRefused):
    """A skill write refused by validation or the guard; ``reason`` names the rule."""


class SkillExists(SkillRefused):
    """A create of a name already taken. ``reason`` is for the model (which has the
    ``edit``/``patch`` actions); people are told what they can do (``name``)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"exists: a skill named {name!r} already exists; use edit or patch")
        self.name = name


@dataclass(frozen=True, slots=True)
class SkillMeta:
    name: str
    description: str
    category: str | None = None
    platforms: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    version: str | None = None
    mcp_tools: tuple[str, ...] = ()

    def offered_on(self, platform: str) -> bool:
        return not self.platforms or platform in self.platforms


def check_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > MAX_NAME_LEN or not _NAME.fullmatch(name):
        raise SkillRefused(
            f"invalid_name: skill name {name!r} must be lowercase letters, digits and '-', "
            f"at most {MAX_NAME_LEN} characters"
        )
    return name


def check_category(category: object) -> str:
    if not isinstance(category, str) or len(category) > MAX_NAME_LEN or not _CATEGORY.fullmatch(category):
        raise SkillRefused(
            f"invalid_category: category {category!r} must be lowercase letters, digits, '-' or '_'"
        )
    return category


def _str_list(key: str, value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SkillRefused(f"invalid_front_matter: {key!r} must be a list of strings")
    return tuple(value)


def parse_skill(text: str, folder_name: str | None = None) -> SkillMeta:
    """Validate a whole SKILL.md and return its front matter; raise ``SkillRefused``."""
    if len(text) > MAX_SKILL_CHARS:
        raise SkillRefused(
            f"too_large: SKILL.md has {len(text):,} characters, the limit is {MAX_SKILL_CHARS:,}"
        )
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise SkillRefused("invalid_front_matter: SKILL.md must start with '---' and YAML front matter")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise SkillRefused("invalid_front_matter: the front matter has no closing '---'") from None
    try:
        data = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as e:
        raise SkillRefused(f"invalid_front_matter: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SkillRefused("invalid_front_matter: the front matter must be a YAML mapping")
    name = check_name(data.get("name"))
    if folder_name is not None and name != folder_name:
        raise SkillRefused(
            f"invalid_name: front matter name {name!r} differs from the folder name {folder_name!r}"
        )
    description = data.get("description")
    if not isinstance(description, str) or not description.strip():
        raise SkillRefused("invalid_front_matter: 'description' is required (one line)")
    if "\n" in description.strip() or len(description) > MAX_DESCRIPTION_LEN:
        raise SkillRefused(
            f"invalid_front_matter: 'description' must be one line of at most {MAX_DESCRIPTION_LEN:,} chars"
        )
    category = data.get("category")
    platforms = _str_list("platforms", data.get("platforms"))
    unknown = sorted(set(platforms) - PLATFORMS)
    if unknown:
        raise SkillRefused(
            f"invalid_front_matter: unknown platform(s) {', '.join(unknown)} (allowed: {', '.join(sorted(PLATFORMS))})"
        )
    version = data.get("version")
    mcp_tools = _str_list("mcp_tools", data.get("mcp_tools"))
    odd = [t for t in mcp_tools if not _MCP_TOOL.fullmatch(t) or len(t) > 128]
    if odd:
        raise SkillRefused(
            f"invalid_front_matter: 'mcp_tools' names tools as SERVER__TOOL (e.g. github__create_issue); "
            f"not {', '.join(map(repr, odd))}"
        )
    return SkillMeta(
        name=name,
        description=description.strip(),
        category=None if category is None else check_category(str(category)),
        platforms=platforms,
        tags=_str_list("tags", data.get("tags")),
        version=None if version is None else str(version),
        mcp_tools=mcp_tools,
    )


def check_file_path(file_path: object) -> PurePosixPath:
    """A supporting file's path relative to the skill folder, inside one of the four
    sub-folders: never absolute, never ``..``, never SKILL.md itself."""
    if not isinstance(file_path, str) or not file_path or "\\" in file_path or "\x00" in file_path:
        raise SkillRefused(f"invalid_path: {file_path!r} is not a relative path")
    path = PurePosixPath(file_path)
    if path.is_absolute():
        raise SkillRefused(
            f"invalid_path: {file_path!r} is absolute; give a path relative to the skill folder"
        )
    if any(part in ("..", ".", "") for part in file_path.split("/")):
        raise SkillRefused(f"invalid_path: {file_path!r} contains '..' or an empty part")
    if len(path.parts) < 2 or path.parts[0] not in SUBFOLDERS:
        raise SkillRefused(
            f"invalid_path: {file_path!r} must be inside one of {', '.join(s + '/' for s in SUBFOLDERS)}"
        )
    if any(part.startswith(".") for part in path.parts):
        raise SkillRefused(f"invalid_path: {file_path!r} names a hidden file")
    return path
