"""Configuration: parsed and validated once into frozen settings.

Sources, later ones winning:

1. the embedded defaults below (``mnemo run`` starts on them with nothing configured),
2. ``$MNEMO_HOME/config.yaml`` (behaviour),
3. ``$MNEMO_HOME/.env`` (secrets; ``KEY=value`` lines),
4. the real process environment.

Environment variables are mapped onto settings keys by the single table ``ENV_KEYS``;
this module is the only place in mnemo that reads ``os.environ``. Every other component
receives the frozen sub-config it needs.

Errors are reported with the dotted key name and, where the set is closed, the allowed
values: ``memory.shared_write: 'everyone' is not allowed (allowed: 'admins', 'all')``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails

from mnemo.gateway.errors import ConfigError

DEFAULT_HOME = Path("~/.mnemo")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Price(Section):
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float  # 5-minute cache write (1.25x input)
    cache_read: float  # 0.1x input


DEFAULT_PRICES: dict[str, Price] = {
    "claude-opus-4-7": Price(input=5.0, output=25.0, cache_write=6.25, cache_read=0.50),
    "claude-opus-4-6": Price(input=5.0, output=25.0, cache_write=6.25, cache_read=0.50),
    "claude-sonnet-4-6": Price(input=3.0, output=15.0, cache_write=3.75, cache_read=0.30),
    "claude-sonnet-4-5": Price(input=3.0, output=15.0, cache_write=3.75, cache_read=0.30),
    "claude-haiku-4-5": Price(input=1.0, output=5.0, cache_write=1.25, cache_read=0.10),
}


class LLMSettings(Section):
    model: str = "claude-sonnet-4-6"
    aux_model: str = "claude-haiku-4-5"
    api_key: SecretStr | None = None
    base_url: str | None = None
    max_tokens: int = Field(4096, ge=1, le=64000)
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(4, ge=0, le=10)
    # The SDK has no cap on retry-after (3600 means an hour): ours is explicit.
    retry_after_cap_s: float = Field(30.0, ge=0)
    max_concurrency: int = Field(8, ge=1)
    # None: from the built-in table in gateway/llm.py (MNEMO_CONTEXT_WINDOW overrides).
    context_window: int | None = Field(None, ge=1024)
    cache_ttl: Literal["5m", "1h"] = "5m"
    prices: dict[str, Price] = Field(default_factory=lambda: dict(DEFAULT_PRICES))


class MemorySettings(Section):
    memory_char_limit: int = Field(2200, ge=100, le=100_000)
    user_char_limit: int = Field(1375, ge=100, le=100_000)
    # Who may write the shared MEMORY.md (it reaches every user's prompt).
    shared_write: Literal["admins", "all"] = "admins"
    nudge_interval: int = Field(10, ge=0)  # 0 disables the periodic memory review
    provider: str | None = None  # external memory provider (layer 4), e.g. "holographic"
    provider_timeout_s: float = Field(3.0, gt=0)
    prefetch_timeout_s: float = Field(8.0, gt=0)
    # Append "🧠 <provider> — recalled N memories" to a reply that used recalled context.
    show_recall_indicator: bool = True


class SkillsSettings(Section):
    # At most this many skills are visible to one user (their own first, then shared).
    max_visible: int = Field(200, ge=1, le=10_000)
    # A background skill review may run after a turn with at least this many tool calls.
    review_min_tool_calls: int = Field(5, ge=1)
    index_max_chars: int = Field(3000, ge=200, le=50_000)


class SearchSettings(Section):
    # The session_search result is filled with matches (each with the turns around it)
    # up to about this many tokens; 0 turns the budget off (then default_limit matches).
    max_result_tokens: int = Field(2000, ge=0, le=20_000)
    # Turns of the conversation shown before and after each match.
    context_before: int = Field(2, ge=0, le=10)
    context_after: int = Field(2, ge=0, le=10)
    default_limit: int = Field(5, ge=1, le=50)
    max_limit: int = Field(20, ge=1, le=100)
    digest: bool = False  # summarise hits with the auxiliary model
    semantic: bool = False  # fuse sentence embeddings in (needs pip install 'mnemo[semantic]')
    # A person's own DMs on their linked accounts (/link) are searched together.
    linked_dms: bool = False


class CompressionSettings(Section):
    enabled: bool = True
    threshold: float = Field(0.50, gt=0.0, lt=1.0)
    head_messages: int = Field(3, ge=0)
    tail_min_messages: int = Field(6, ge=2)
    tail_token_ratio: float = Field(0.20, gt=0.0, lt=1.0)
    flush_min_user_turns: int = Field(6, ge=0)


class SessionSettings(Section):
    idle_reset_minutes: int | None = Field(None, ge=1)  # off by default
    daily_reset_hour: int | None = Field(None, ge=0, le=23)  # off by default
    group_sessions_per_user: bool = True
    max_tool_iterations: int = Field(12, ge=1, le=100)
    tool_output_max_chars: int = Field(20_000, ge=500)


class MediaSettings(Section):
    # Image/PDF blocks are re-sent for this many of the newest turns that carry them;
    # older ones get a one-line placeholder (bounded prompt and cache).
    history_images: int = Field(3, ge=1, le=20)


class TranscriptionSettings(Section):
    # An OpenAI-compatible speech-to-text server (…/v1/audio/transcriptions, e.g. a
    # self-hosted Whisper); unset: voice notes are answered with "voice is not set up".
    url: str | None = None
    api_key: SecretStr | None = None
    model: str = "whisper-1"
    timeout_s: float = Field(60.0, gt=0)


class StreamingSettings(Section):
    """Replies shown while they are generated (``gateway/delivery/streaming.py``).

    ``streaming: true`` / ``streaming: false`` in config.yaml is shorthand for
    ``streaming: {enabled: …}``. ``enabled`` covers DMs of every platform;
    ``platforms`` overrides it per platform (``{discord: false}``); shared rooms and
    groups stream only with ``groups: true``. Edits of one message are at most one per
    ``min_interval_s`` (and never faster than the platform allows)."""

    enabled: bool = True
    min_interval_s: float = Field(1.0, ge=0.05, le=60.0)
    groups: bool = False
    platforms: dict[str, bool] = Field(default_factory=dict)

    def applies(self, platform: str, *, dm: bool) -> bool:
        if not dm and not self.groups:
            return False
        return self.platforms.get(platform, self.enabled)


class GatewaySettings(Section):
    debounce_s: float = Field(0.6, ge=0.0, le=10.0)
    lane_idle_s: float = Field(300.0, gt=0)
    timezone: str = "UTC"


class BudgetLimits(Section):
    """A person's caps; None: no cap of that kind."""

    daily_usd: float | None = Field(None, ge=0)
    monthly_usd: float | None = Field(None, ge=0)
    daily_tokens: int | None = Field(None, ge=0)


class GlobalBudget(Section):
    daily_usd: float | None = Field(None, ge=0)


class BudgetSettings(Section):
    """Hard spending caps (``gateway/budgets``): per person (overridable per user with
    ``mnemo users budget``) and for the whole bot; days and months are those of
    ``gateway.timezone``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    per_user: BudgetLimits = BudgetLimits()
    global_: GlobalBudget = Field(GlobalBudget(), alias="global")
    admins_exempt: bool = True  # from the per-user caps; the global cap binds everyone


class WorkerSettings(Section):
    concurrency: int = Field(2, ge=1, le=64)
    max_attempts: int = Field(5, ge=1)
    drain_timeout_s: float = Field(10.0, ge=0)


class TelegramSettings(Section):
    bot_token: SecretStr | None = None
    api_base_url: str = "https://api.telegram.org"
    webhook_url: str | None = None
    webhook_secret: SecretStr | None = None
    allowed_users: tuple[str, ...] = ()
    groups_enabled: bool = False


class DiscordSettings(Section):
    bot_token: SecretStr | None = None
    api_base_url: str | None = None
    gateway_url: str | None = None
    allowed_users: tuple[str, ...] = ()
    allowed_channels: tuple[str, ...] = ()
    thread_reply_channels: tuple[str, ...] = ()
    shared_room_channels: tuple[str, ...] = ()
    # Sharding across replicas: the bot's number of gateway shards, and the ones this
    # replica connects (env DISCORD_SHARD_IDS per replica). None: one unsharded
    # connection; a count without ids: this process connects every shard.
    shard_count: int | None = Field(None, ge=1)
    shard_ids: tuple[int, ...] = ()

    @field_validator("shard_ids")
    @classmethod
    def _shards_within_count(cls, v: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        if not v:
            return v
        count = info.data.get("shard_count")
        if count is None:
            raise ValueError(
                "needs discord.shard_count (DISCORD_SHARD_COUNT), the bot's total number of shards"
            )
        outside = sorted({i for i in v if not 0 <= i < count})
        if outside:
            raise ValueError(
                f"shard ids run from 0 to {count - 1} (discord.shard_count is {count}); "
                f"outside that: {', '.join(map(str, outside))}"
            )
        if len(set(v)) != len(v):
            raise ValueError("lists a shard twice")
        return tuple(sorted(v))


class WebSettings(Section):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)  # 0 picks a free port
    access_token: SecretStr | None = None
    # The admin dashboard's sign-in token (/admin). Unset: `mnemo run` generates one
    # the first time, stores it 0600 in $MNEMO_HOME/admin_token and prints it once.
    admin_token: SecretStr | None = None


class AccessSettings(Section):
    admins: tuple[str, ...] = ()  # "platform:user_id"
    # Extra allowlist entries on any platform: "platform:user_id", or "platform:*" to
    # admit everyone on that platform (e.g. a private Discord server).
    allowed: tuple[str, ...] = ()
    pairing: bool = True
    unauthorized_reply: Literal["refuse", "silent"] = "refuse"
    rate_limit_per_minute: int = Field(20, ge=0)  # 0 disables


class CronSettings(Section):
    timezone: str | None = None  # None: gateway.timezone
    min_interval_s: int = Field(60, ge=1)
    misfire_grace_s: int = Field(300, ge=1)
    coalesce: bool = True
    max_prompt_chars: int = Field(4000, ge=1)
    poll_s: float = Field(2.0, gt=0)
    jobs: tuple[dict[str, Any], ...] = ()


class DatabaseSettings(Section):
    """Where everything durable lives: unset ``url`` = ``$MNEMO_HOME/state.db`` (SQLite);
    ``postgresql://…`` = a PostgreSQL ≥ 15 server (``pip install 'mnemo[postgres]'``)."""

    url: SecretStr | None = None  # secret: it may carry a password
    pool_size: int = Field(10, ge=1, le=200)  # connections per process
    connect_timeout_s: float = Field(10.0, gt=0)
    # Who this process is among replicas (claims of inbox rows, jobs and sends carry it;
    # `mnemo status` lists it; env MNEMO_REPLICA_ID). Unique per running process: a
    # second one with the same id is refused. None: host:pid.
    replica_id: str | None = None

    @field_validator("url")
    @classmethod
    def _postgresql_only(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None or not v.get_secret_value().strip():
            return None
        scheme = v.get_secret_value().split("://", 1)[0].lower()
        if scheme not in ("postgresql", "postgres"):
            raise ValueError("must be a postgresql://… URL (leave it unset for the SQLite state.db)")
        return v

    @property
    def is_postgresql(self) -> bool:
        return self.url is not None


class BackupSettings(Section):
    """Automatic backups (mnemo/backups.py): the `mnemo export` archive, on a schedule."""

    enabled: bool = True
    schedule: str = "0 4 * * *"  # crontab, in gateway.timezone (the bot's local time)
    keep: int = Field(7, ge=1)
    dir: Path | None = None  # None: $MNEMO_HOME/backups/


class LoggingSettings(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "console", "json"] = "auto"


# Shown wherever a person can mistake the scripted model for Claude (CLI, web page, logs).
TRIAL_BANNER = (
    "LOCAL TRIAL MODE: no ANTHROPIC_API_KEY is set, so replies come from a built-in "
    "SCRIPTED model, not Claude. Set ANTHROPIC_API_KEY (in the environment or "
    "$MNEMO_HOME/.env) and restart for real answers."
)


class ProvidersSettings(Section):
    # External memory providers: the longest a reply waits for one (prefetch, hooks).
    # None: memory.provider_timeout_s for hooks and memory.prefetch_timeout_s for recall.
    timeout_s: float | None = Field(None, gt=0)


class Settings(Section):
    home: Path
    llm: LLMSettings = LLMSettings()
    memory: MemorySettings = MemorySettings()
    skills: SkillsSettings = SkillsSettings()
    search: SearchSettings = SearchSettings()
    compression: CompressionSettings = CompressionSettings()
    sessions: SessionSettings = SessionSettings()
    gateway: GatewaySettings = GatewaySettings()
    worker: WorkerSettings = WorkerSettings()
    telegram: TelegramSettings = TelegramSettings()
    discord: DiscordSettings = DiscordSettings()
    web: WebSettings = WebSettings()
    access: AccessSettings = AccessSettings()
    cron: CronSettings = CronSettings()
    database: DatabaseSettings = DatabaseSettings()
    logging: LoggingSettings = LoggingSettings()
    budgets: BudgetSettings = BudgetSettings()
    providers: ProvidersSettings = ProvidersSettings()
    backup: BackupSettings = BackupSettings()
    media: MediaSettings = MediaSettings()
    transcription: TranscriptionSettings = TranscriptionSettings()
    streaming: StreamingSettings = StreamingSettings()

    @field_validator("streaming", mode="before")
    @classmethod
    def _streaming_shorthand(cls, v: Any) -> Any:
        return {"enabled": v} if isinstance(v, bool) else v

    @field_validator("home")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    # --- derived paths: $MNEMO_HOME roots every path -----------------------------------
    @property
    def config_path(self) -> Path:
        return self.home / "config.yaml"

    @property
    def memories_dir(self) -> Path:
        return self.home / "memories"

    @property
    def state_db(self) -> Path:
        return self.home / "state.db"

    @property
    def soul_path(self) -> Path:
        return self.home / "SOUL.md"

    @property
    def skills_dir(self) -> Path:
        return self.home / "skills"

    @property
    def providers_dir(self) -> Path:
        return self.home / "providers"

    # --- facts derived from what is configured ----------------------------------------
    @property
    def has_llm_endpoint(self) -> bool:
        return self.llm.api_key is not None or self.llm.base_url is not None

    @property
    def platform_tokens(self) -> tuple[str, ...]:
        """Names of the public platforms that have a token configured."""
        out = []
        if self.telegram.bot_token is not None:
            out.append("telegram")
        if self.discord.bot_token is not None:
            out.append("discord")
        return tuple(out)

    @property
    def known_platforms(self) -> frozenset[str]:
        """Platforms a chat of this bot can be on: the adapters mnemo ships, and any
        platform the access lists name (an adapter added by a plugin or a test)."""
        named = {
            entry.split(":", 1)[0] for entry in (*self.access.allowed, *self.access.admins) if ":" in entry
        }
        return frozenset({"telegram", "discord", "web", "cli", *named})

    @property
    def trial_mode(self) -> bool:
        """Nothing configured: loopback adapters and the scripted offline model."""
        return not self.has_llm_endpoint and not self.platform_tokens

    def secret_values(self) -> tuple[str, ...]:
        """Every configured secret, for log redaction."""
        secrets = (
            self.llm.api_key,
            self.telegram.bot_token,
            self.telegram.webhook_secret,
            self.discord.bot_token,
            self.web.access_token,
            self.database.url,
        )
        return tuple(s.get_secret_value() for s in secrets if s is not None and s.get_secret_value())


# Environment variable -> dotted settings key. The one table of env names.
ENV_KEYS: dict[str, str] = {
    "ANTHROPIC_API_KEY": "llm.api_key",
    "ANTHROPIC_BASE_URL": "llm.base_url",
    "MNEMO_MODEL": "llm.model",
    "MNEMO_AUX_MODEL": "llm.aux_model",
    "MNEMO_CONTEXT_WINDOW": "llm.context_window",
    "TELEGRAM_BOT_TOKEN": "telegram.bot_token",
    "TELEGRAM_API_BASE_URL": "telegram.api_base_url",
    "TELEGRAM_WEBHOOK_URL": "telegram.webhook_url",
    "TELEGRAM_WEBHOOK_SECRET": "telegram.webhook_secret",
    "TELEGRAM_ALLOWED_USERS": "telegram.allowed_users",
    "DISCORD_BOT_TOKEN": "discord.bot_token",
    "DISCORD_ALLOWED_USERS": "discord.allowed_users",
    "DISCORD_ALLOWED_CHANNELS": "discord.allowed_channels",
    "DISCORD_API_BASE_URL": "discord.api_base_url",
    "DISCORD_GATEWAY_URL": "discord.gateway_url",
    "DISCORD_SHARD_COUNT": "discord.shard_count",
    "DISCORD_SHARD_IDS": "discord.shard_ids",
    "MNEMO_ADMINS": "access.admins",
    "MNEMO_WEB_HOST": "web.host",
    "MNEMO_WEB_PORT": "web.port",
    "MNEMO_WEB_TOKEN": "web.access_token",
    "MNEMO_DATABASE_URL": "database.url",
    "MNEMO_REPLICA_ID": "database.replica_id",
    "MNEMO_LOG_LEVEL": "logging.level",
    "MNEMO_LOG_FORMAT": "logging.format",
}

# Keys whose environment value is a comma-separated list.
_LIST_KEYS = {
    "telegram.allowed_users",
    "discord.allowed_users",
    "discord.allowed_channels",
    "discord.shard_ids",
    "access.admins",
}


def resolve_home(cli_home: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> Path:
    """``--home`` beats ``$MNEMO_HOME`` beats ``~/.mnemo``."""
    env = os.environ if environ is None else environ
    raw = cli_home or env.get("MNEMO_HOME") or DEFAULT_HOME
    return Path(raw).expanduser().resolve()


def read_dotenv(path: Path) -> dict[str, str]:
    """Parse ``KEY=value`` lines; ``#`` comments, ``export`` prefixes and quotes allowed."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return out
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(f"{path}:{lineno}: expected KEY=value")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        else:
            value = value.split(" #", 1)[0].rstrip()
        out[key] = value
    return out


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for p in parents:
        child = node.get(p)
        if not isinstance(child, dict):
            child = {}
            node[p] = child
        node = child
    node[leaf] = value


def _env_overlay(tree: dict[str, Any], env: Mapping[str, str]) -> None:
    for name, dotted in ENV_KEYS.items():
        value = env.get(name)
        if value is None or value == "":
            continue
        if dotted in _LIST_KEYS:
            _set_dotted(tree, dotted, tuple(v.strip() for v in value.split(",") if v.strip()))
        else:
            _set_dotted(tree, dotted, value)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Settings
    for part in loc[:-1]:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return model


def _allowed_values(loc: tuple[Any, ...]) -> tuple[Any, ...] | None:
    model = _model_at(loc)
    if model is None or not isinstance(loc[-1], str):
        return None
    field = model.model_fields.get(loc[-1])
    if field is None:
        return None
    ann = field.annotation
    if get_origin(ann) is Literal:
        return get_args(ann)
    return None


def _describe(err: ErrorDetails) -> str:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    key = ".".join(str(p) for p in loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        model = _model_at(loc)
        allowed = sorted(model.model_fields) if model is not None else []
        return f"{key}: unknown key (allowed here: {', '.join(allowed)})"
    allowed_values = _allowed_values(loc)
    given = err.get("input")
    if allowed_values is not None:
        opts = ", ".join(repr(v) for v in allowed_values)
        return f"{key}: {given!r} is not allowed (allowed: {opts})"
    msg = err.get("msg", "invalid value")
    return f"{key}: {msg} (got {given!r})" if not isinstance(given, dict) else f"{key}: {msg}"


def load_settings(
    home: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the frozen settings for one profile.

    ``environ`` defaults to the process environment; tests pass a dict instead.
    ``overrides`` maps dotted keys to values and wins over every file and variable.
    Raises ``ConfigError`` listing every problem found. The entries of ``cron.jobs``
    are the cron sub-system's to check (``cron.service.check_declared_jobs``, called
    by the CLI with the settings): this module is below every sub-package.
    """
    env = dict(os.environ if environ is None else environ)
    root = resolve_home(home, env)
    _check_home(root, "--home" if home else "MNEMO_HOME" if env.get("MNEMO_HOME") else "the default home")
    tree: dict[str, Any] = {}
    cfg = root / "config.yaml"
    if cfg.exists():
        try:
            loaded = yaml.safe_load(cfg.read_text(encoding="utf-8-sig"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise ConfigError(f"{cfg}: cannot parse: {e}") from e
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{cfg}: the top level must be a mapping of sections")
        if "home" in loaded:
            raise ConfigError(f"{cfg}: 'home' cannot be set in config.yaml (use --home or MNEMO_HOME)")
        tree.update(loaded)
    file_env = read_dotenv(root / ".env")
    _env_overlay(tree, {**file_env, **env})
    for dotted, value in (overrides or {}).items():
        _set_dotted(tree, dotted, value)
    tree["home"] = root
    try:
        settings = Settings.model_validate(tree)
    except ValidationError as e:
        lines = [_describe(err) for err in e.errors()]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None
    return settings


def _check_home(root: Path, source: str) -> None:
    """The home (or the first part of its path that exists) must be a folder."""
    for path in (root, *root.parents):
        if path.is_dir():
            return
        if path.exists():
            what = (
                f"{root} is a file, not a folder"
                if path == root
                else f"{path} (in {root}) is a file, not a folder"
            )
            raise ConfigError(f"{source}: {what}; point it at a folder for mnemo's profile")
