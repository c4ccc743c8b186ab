"""Configuration: parsed and validated once into frozen settings.

Sources, later ones winning:

1. the embedded defaults below (``mnemo run`` starts on them with nothing configured),
2. ``$MNEMO_HOME/config.yaml`` (behaviour),
3. ``$MNEMO_HOME/.env`` (secrets; ``KEY=value`` lines, read by python-dotenv's parser),
4. the real process environment.

Environment variables are mapped onto settings keys by the single table ``ENV_KEYS``;
this module is the only place in mnemo that reads ``os.environ``. Every other component
receives the frozen sub-config it needs.

Errors are reported with the dotted key name and, where the set is closed, the allowed
values: ``memory.shared_write: 'everyone' is not allowed (allowed: 'admins', 'all')``.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from mnemo.gateway.errors import ConfigError, StartupError

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


class MemoryPolicySettings(Section):
    """``memory.policy.*``: what holds for a person or chat that set nothing (``/memory
    policy``, ``mnemo users policy``, ``mnemo chats policy``; ``memory/policy.py``)."""

    remember: Literal["on", "off", "ask"] = "on"  # a person's default
    groups: Literal["private", "shared"] = "private"  # a person's USER.md in group prompts
    group_remember: Literal["on", "off"] = "on"  # a group chat's default
    history: Literal["on", "off"] = "on"  # whether a chat's messages are kept between turns

    @field_validator("remember", "group_remember", "history", mode="before")
    @classmethod
    def _yaml_switch(cls, value: object) -> object:
        # YAML reads a bare on/off as true/false.
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class UpkeepSettings(Section):
    """``memory.upkeep.*``: hard caps on background memory work (flush, review,
    compression summaries, skill review, consolidation) apart from the budgets. Tokens
    are counted like the budgets' (everything the model read, cache reads included,
    plus its output) per local day of ``gateway.timezone``; None: no cap of that kind.
    At a cap background work waits (for the next day, or for the hour to pass)."""

    daily_tokens_per_person: int | None = Field(2_000_000, ge=0)
    global_daily_tokens: int | None = Field(20_000_000, ge=0)
    # Background model requests one session may make in any 60 minutes.
    session_passes_per_hour: int | None = Field(20, ge=0)
    # The same job kind runs at most this many times for one session without a new user
    # message in between (a job that re-enqueues itself stops here).
    max_runs_without_message: int = Field(3, ge=1)


class ConsolidationSettings(Section):
    """``memory.consolidation.*``: a scheduled pass over each person's USER.md and the
    shared MEMORY.md that *proposes* (never makes) merges of duplicates, removals of
    stale entries and fixes of contradictions; people accept or reject them
    (``/memory proposals``, ``mnemo memory proposals``). Opt-in."""

    enabled: bool = False
    schedule: str = "30 3 * * *"  # crontab, in gateway.timezone: nightly at 03:30
    # Entries shorter than this many in a file are not worth a request.
    min_entries: int = Field(4, ge=2)

    @field_validator("schedule")
    @classmethod
    def _crontab(cls, value: str) -> str:
        # The schedule itself runs on gateway/cron/calendar.py (which checks it again,
        # naming the field at fault); here only whether cron can read it at all.
        from datetime import datetime

        from cronsim import CronSim, CronSimError

        try:
            CronSim(" ".join(value.split()), datetime(2026, 1, 1))
        except CronSimError as e:
            raise ValueError(f"invalid cron expression {value!r}: {e}") from None
        return value


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
    policy: MemoryPolicySettings = MemoryPolicySettings()
    upkeep: UpkeepSettings = UpkeepSettings()
    consolidation: ConsolidationSettings = ConsolidationSettings()


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


class MediaQuotaSettings(Section):
    """Limits on the files kept for people (``gateway/media_quota.py``), in bytes; None:
    no limit. Daily ones count what was stored on the local day (``gateway.timezone``),
    total ones what is kept now (stored images and PDFs, and web uploads under a day old)."""

    per_person_daily_bytes: int | None = Field(100 * 2**20, ge=0)
    per_person_total_bytes: int | None = Field(2 * 2**30, ge=0)
    global_daily_bytes: int | None = Field(2**30, ge=0)
    global_total_bytes: int | None = Field(20 * 2**30, ge=0)


class MediaSettings(Section):
    # Image/PDF blocks are re-sent for this many of the newest turns that carry them;
    # older ones get a one-line placeholder (bounded prompt and cache).
    history_images: int = Field(3, ge=1, le=20)
    quota: MediaQuotaSettings = MediaQuotaSettings()


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
    # Turns running at once, granted in arrival order (gateway/inbound/lanes.py); None:
    # llm.max_concurrency plus the number of CPU cores.
    max_concurrent_turns: int | None = Field(None, ge=1, le=10_000)
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
TRIAL_DETAIL = (
    "no ANTHROPIC_API_KEY is set, so replies come from a built-in SCRIPTED model, not "
    "Claude. Run `mnemo setup` (or set ANTHROPIC_API_KEY in the environment or "
    "$MNEMO_HOME/.env) and restart for real answers."
)
TRIAL_BANNER = f"LOCAL TRIAL MODE: {TRIAL_DETAIL}"


class ProvidersSettings(Section):
    # External memory providers: the longest a reply waits for one (prefetch, hooks).
    # None: memory.provider_timeout_s for hooks and memory.prefetch_timeout_s for recall.
    timeout_s: float | None = Field(None, gt=0)


# Who may use something (an MCP server's tools, the ``delegate`` tool): every admin
# (``access.admins``), everyone the bot answers, or the people listed as PLATFORM:ID.
Audience = Literal["admins", "users"] | tuple[str, ...]
_SERVER_NAME = re.compile(r"[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*")
_PERSON = re.compile(r"[a-z][a-z0-9_-]*:[^\s:]+")


def _check_audience(v: Any) -> Any:
    """Before validation: 'admins', 'users', or a list of PLATFORM:ID, with one clear message."""
    if isinstance(v, str) and v not in ("admins", "users"):
        raise ValueError("must be 'admins', 'users' or a list of people as PLATFORM:ID")
    if isinstance(v, list | tuple):
        bad = [p for p in v if not isinstance(p, str) or not _PERSON.fullmatch(p)]
        if bad:
            raise ValueError(f"people are PLATFORM:ID, e.g. telegram:123456; not {', '.join(map(repr, bad))}")
        return tuple(v)
    return v


class McpServerSettings(Section):
    """One MCP server the agent may use (``gateway/mcp``): a command mnemo starts and
    talks to over stdio, or a streamable-HTTP URL. ``env`` and ``headers`` values may
    name variables of ``.env`` or the environment as ``${NAME}``; they are secrets."""

    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, SecretStr] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    # "all", or the server's tool names the agent is offered.
    tools: Literal["all"] | tuple[str, ...] = "all"
    allowed: Audience = "admins"
    timeout_s: float = Field(30.0, gt=0, le=600)

    @field_validator("allowed", mode="before")
    @classmethod
    def _people(cls, v: Any) -> Any:
        return _check_audience(v)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSettings:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either 'command' (stdio) or 'url' (streamable HTTP)")
        if self.url is not None:
            if not self.url.startswith(("http://", "https://")):
                raise ValueError("'url' must be an http:// or https:// URL")
            if self.args or self.env:
                raise ValueError("'args' and 'env' are for a 'command' server")
        if self.command is not None and self.headers:
            raise ValueError("'headers' are for a 'url' server")
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


class McpServeSettings(Section):
    """``mnemo mcp serve``: mnemo's memory offered to another assistant."""

    # The client's token for ``--stdio`` (env MNEMO_MCP_TOKEN, set by the client that
    # starts the process); over HTTP every request carries its own bearer token.
    token: SecretStr | None = None
    # Browser origins allowed to call ``--http`` (a request with any other Origin is
    # refused); empty: only clients that send no Origin (not browsers).
    allowed_origins: tuple[str, ...] = ()


class McpSettings(Section):
    servers: dict[str, McpServerSettings] = Field(default_factory=dict)
    # A tool result longer than this is cut (before the threat scan and the fence).
    max_result_chars: int = Field(8000, ge=200, le=60_000)
    # Connecting and listing one server's tools, at start and on reload.
    connect_timeout_s: float = Field(20.0, gt=0, le=600)
    # How often a server that failed or timed out is checked again.
    probe_interval_s: float = Field(30.0, gt=0)
    serve: McpServeSettings = McpServeSettings()

    @field_validator("servers")
    @classmethod
    def _server_names(cls, v: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
        bad = [n for n in v if not _SERVER_NAME.fullmatch(n) or len(n) > 32]
        if bad:
            raise ValueError(
                f"server names are letters and digits joined by single '-' or '_', at most 32 "
                f"characters (got {', '.join(map(repr, bad))})"
            )
        return v


class DelegationSettings(Section):
    """The ``delegate`` tool (``gateway/turns/delegate.py``): a sub-agent with a fresh context."""

    allowed: Audience = "admins"
    max_steps: int = Field(8, ge=1, le=50)  # tool rounds of one sub-agent
    max_tokens: int = Field(60_000, ge=1000)  # input + output tokens of one sub-agent, all requests
    model: str | None = None  # None: llm.model

    @field_validator("allowed", mode="before")
    @classmethod
    def _people(cls, v: Any) -> Any:
        return _check_audience(v)


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
    mcp: McpSettings = McpSettings()
    delegation: DelegationSettings = DelegationSettings()

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

    def check_can_serve(self) -> None:
        """A public bot never answers with the scripted trial model: a platform token
        without an LLM key or base URL is a start-up error (``StartupError``, exit 2)."""
        if self.platform_tokens and not self.has_llm_endpoint:
            raise StartupError(
                f"{', '.join(self.platform_tokens)} token configured but no ANTHROPIC_API_KEY or "
                "ANTHROPIC_BASE_URL: refusing to answer a public chat with the scripted trial model."
            )

    def secret_values(self) -> tuple[str, ...]:
        """Every configured secret, for log redaction."""
        secrets = (
            self.llm.api_key,
            self.telegram.bot_token,
            self.telegram.webhook_secret,
            self.discord.bot_token,
            self.web.access_token,
            self.database.url,
            self.mcp.serve.token,
            *(
                v
                for server in self.mcp.servers.values()
                for v in (*server.env.values(), *server.headers.values())
            ),
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
    "MNEMO_MCP_TOKEN": "mcp.serve.token",
}

# Keys whose environment value is a comma-separated list.
_LIST_KEYS = {
    "telegram.allowed_users",
    "discord.allowed_users",
    "discord.allowed_channels",
    "discord.shard_ids",
    "access.admins",
}


def wants_color(environ: Mapping[str, str] | None = None) -> bool:
    """Whether output may be coloured: not when ``NO_COLOR`` is set to anything but ""
    (no-color.org), nor on ``TERM=dumb``. (The caller checks it writes to a terminal.)"""
    env = os.environ if environ is None else environ
    return not env.get("NO_COLOR") and env.get("TERM") != "dumb"


def resolve_home(cli_home: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> Path:
    """``--home`` beats ``$MNEMO_HOME`` beats ``~/.mnemo``."""
    env = os.environ if environ is None else environ
    raw = cli_home or env.get("MNEMO_HOME") or DEFAULT_HOME
    return Path(raw).expanduser().resolve()


def read_dotenv(path: Path) -> dict[str, str]:
    """``$MNEMO_HOME/.env`` through python-dotenv's parser: ``KEY=value`` lines,
    ``export`` prefixes, ``#`` comments (whole lines, and after a value), single and
    double quotes (removed; escapes inside double quotes read), values spanning lines
    inside quotes. No ``${VAR}`` expansion: a secret is taken exactly as written.

    A statement the parser cannot read (or without ``=``, or whose name is not a
    variable name) is a ``ConfigError`` naming the file and line, never the value.
    The parser (``dotenv.parser.parse_stream``) is used rather than ``dotenv_values``
    because the latter only logs such lines — with a warning — and skips them."""
    from dotenv.parser import parse_stream

    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return out
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    for binding in parse_stream(io.StringIO(text)):
        if binding.key is None and not binding.error:
            continue  # a blank line or a comment
        original = binding.original
        # A statement's text starts with the blank lines before it.
        skipped = original.string[: len(original.string) - len(original.string.lstrip())]
        line = original.line + skipped.count("\n")
        if binding.error or binding.key is None:
            raise ConfigError(f"{path}:{line}: expected KEY=value (quote a value that holds spaces or #)")
        if binding.value is None:  # the "key" may be a pasted secret: never repeat it
            raise ConfigError(f"{path}:{line}: expected KEY=value (no '=' on this line)")
        if not binding.key.isidentifier():
            raise ConfigError(f"{path}:{line}: expected KEY=value (not a variable name before '=')")
        out[binding.key] = binding.value
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


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _interpolate_mcp(tree: dict[str, Any], env: Mapping[str, str]) -> None:
    """``${NAME}`` in an MCP server's ``env`` and ``headers`` values, from ``.env`` or the
    environment (secrets stay out of config.yaml); an unset name is a configuration error."""
    mcp = tree.get("mcp")
    servers = mcp.get("servers") if isinstance(mcp, dict) else None
    if not isinstance(servers, dict):
        return
    missing: list[str] = []
    for name, server in servers.items():
        for part in ("env", "headers"):
            values = server.get(part) if isinstance(server, dict) else None
            if not isinstance(values, dict):
                continue
            for key, value in values.items():
                if not isinstance(value, str):
                    continue

                def sub(m: re.Match[str], where: str = f"mcp.servers.{name}.{part}.{key}") -> str:
                    found = env.get(m.group(1))
                    if found is None:
                        missing.append(f"{where}: ${{{m.group(1)}}} is not set (in .env or the environment)")
                        return ""
                    return found

                values[key] = _VARIABLE.sub(sub, value)
    if missing:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(missing))


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
    _interpolate_mcp(tree, {**file_env, **env})
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
