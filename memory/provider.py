"""The memory provider contract (layer 4).

A provider adds recall beyond the curated files: ``MemoryManager`` (memory/manager.py)
holds the built-in provider plus at most one external one and is the only caller of
every method below. Lifecycle, per process::

    is_available(home, config) → initialize(home, config)
      → per turn: [on_turn_start] prefetch … handle_tool_call* … sync_turn → queue_prefetch
      → shutdown()

Threading: methods are plain synchronous functions. The manager runs each call in a
worker thread under a timeout, so a provider may block on SQLite or a synchronous HTTP
client without stalling other chats — and must expect concurrent calls from several
threads (one per chat being served), guarding its own shared state.

Failure: anything a method raises is caught by the manager, logged, and the turn goes
on without that provider's contribution (``ProviderError`` is the polite way to fail).
A provider whose ``initialize`` raises is not used at all: its tools are never offered.

Per-turn identity — deviation from the reference signature, on purpose: Hermes passes
the session id and user to ``initialize(session_id, **kw)`` and keeps them on the
instance, which is wrong when one process serves many chats at once. Here
``initialize(home, config)`` is process-wide and every per-turn method receives a
frozen ``ProviderContext`` naming the session, chat, user and agent context of *that*
call. Never store it on ``self``.

Writes: the manager calls ``sync_turn``, ``on_memory_write``, ``on_session_end``,
``on_pre_compress`` and ``on_delegation`` only when ``ctx.agent_context`` is PRIMARY.
Tool calls arrive in every context; a tool that writes must check ``ctx.may_write``.
Everything a provider stores from a tool call reaches later prompts, so it passes the
same threat scan as curated memory: list those arguments in ``ToolSchema.durable_args``
(the manager scans them), and scan any other text you persist with
``memory.threats.guard_write``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from mnemo.memory.provider_config import ConfigField, write_provider_config
from mnemo.memory.scope import AgentContext, UserRef

if TYPE_CHECKING:
    from mnemo.memory.journal import DocumentJournal, Provenance
    from mnemo.memory.memory_tool import MemoryWrite

INDICATOR_GLYPH = "🧠"

# Messages API shape: {"role": "user"|"assistant", "content": str | [blocks]}.
Messages = Sequence[Mapping[str, Any]]


def message_text(content: Any) -> str:
    """The text of an API-shaped message's content (a string, or the text blocks of a
    list): what providers store of the messages the hooks hand them."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b.get("text", "") for b in content if isinstance(b, Mapping) and b.get("type") == "text"
        )
    return ""


@dataclass(frozen=True, slots=True)
class Availability:
    ok: bool
    reason: str = ""  # why not, in words a user can act on


@dataclass(frozen=True, slots=True)
class ProviderContext:
    """Who and where one call is made for. Built by the agent per turn."""

    session_id: str
    chat_key: str
    platform: str
    user: UserRef | None  # the turn's author; None when nobody speaks (e.g. cron)
    agent_context: AgentContext
    home: Path
    # The canonical account the author is linked to (``memory/identity.py``), set by the
    # MemoryManager; None: not linked. Provider scopes are the person's, not the account's.
    person: UserRef | None = None
    # The memory policy lets this turn store without asking (``memory/policy.py``):
    # False in an ephemeral chat, for a person with remember off or ask.
    remember: bool = True
    message_id: str | None = None  # the platform message the turn answers (journal provenance)
    tool_call_id: str | None = None
    actor: str = "model"  # who calls (``journal.Actor``): the model, or "cli", "mcp", …

    @property
    def may_write(self) -> bool:
        """Writes reach providers from a conversation turn whose policy lets it store."""
        return self.agent_context is AgentContext.PRIMARY and self.remember

    @property
    def owner(self) -> UserRef | None:
        """Whose memory this call reads and writes: the person (linked accounts), else the author."""
        return self.person or self.user

    def provenance(self) -> Provenance:
        """How a write made for this call is journaled: what the model writes is
        ``inferred``; a person's tool (CLI, MCP) writes as ``admin``."""
        from mnemo.memory.journal import Provenance, Trust

        trust = Trust.INFERRED if self.actor == "model" else Trust.ADMIN
        return Provenance(
            self.actor,
            trust,
            speaker=None if self.user is None else str(self.user),
            session=self.session_id or None,
            message=self.message_id,
            chat=self.chat_key or None,
            tool_call=self.tool_call_id,
        )


@dataclass(frozen=True, slots=True)
class RecallIndicator:
    """What the last prefetch injected, for a deterministic "memory was used" mark."""

    provider_label: str
    count: int  # discrete memories; 0 = content without a discrete count
    glyph: str = INDICATOR_GLYPH

    def render(self) -> str:
        if self.count <= 0:
            return f"{self.glyph} {self.provider_label} — recalled context"
        noun = "memory" if self.count == 1 else "memories"
        return f"{self.glyph} {self.provider_label} — recalled {self.count} {noun}"


@dataclass(frozen=True, slots=True)
class Recall:
    """A provider's prefetch result: raw text and how many memories it holds.

    ``MemoryManager.prefetch`` returns one too, whose ``text`` is the finished,
    sanitized ``<memory-context>`` block and whose ``label`` names the providers.
    """

    text: str
    count: int = 0
    label: str = ""
    glyph: str = INDICATOR_GLYPH

    def indicator(self) -> RecallIndicator:
        return RecallIndicator(self.label, self.count, self.glyph)


@dataclass(frozen=True, slots=True)
class ToolSchema:
    name: str
    description: str
    input_schema: Mapping[str, Any]
    # String arguments the provider stores and later recalls into a prompt ("remember",
    # "conclude", a fact's content): the manager passes each through the threat scan
    # (``memory.threats.guard_write``) and refuses the call before the provider sees it.
    durable_args: tuple[str, ...] = ()

    def to_api(self) -> dict[str, Any]:
        """The Anthropic tool definition."""
        return {"name": self.name, "description": self.description, "input_schema": dict(self.input_schema)}


class MemoryProvider(ABC):
    """Subclass, set the class attributes, implement the five abstract methods.

    Constructed with no arguments and no I/O (discovery instantiates providers only to
    describe them).
    """

    name: ClassVar[str]  # short id, used in config (memory.provider) and folders
    description: ClassVar[str]  # one line for `mnemo providers list`
    label: ClassVar[str] = ""  # display name for the recall indicator; default: name
    builtin: ClassVar[bool] = False  # True only for the curated-files provider
    glyph: ClassVar[str] = INDICATOR_GLYPH
    # Pre-compress checkpoint contract: 1 = best effort; 2 = fail-closed, i.e. the
    # provider durably captures what it is given and a failure stops compression.
    checkpoint_version: ClassVar[int] = 1
    # True for a provider that keeps its data in the bot's own database when that is
    # PostgreSQL: it is then initialized with ``database_url`` so replicas share it.
    shares_database: ClassVar[bool] = False

    @property
    def display_label(self) -> str:
        return self.label or self.name

    # --- lifecycle (process-wide) --------------------------------------------------
    @abstractmethod
    def is_available(self, home: Path, config: Mapping[str, Any]) -> Availability:
        """Called by discovery and the manager before ``initialize``. Checks
        configuration, dependencies and local files only — never the network."""

    @abstractmethod
    def initialize(self, home: Path, config: Mapping[str, Any]) -> None:
        """Called once at start-up (off the event loop). Open stores, create folders
        under ``home / "providers" / name``. Raise ``ProviderError`` to refuse."""

    def system_prompt_block(self) -> str:
        """Static text for the system prompt, rendered once per session; must not
        change between calls (it sits in the cached prefix)."""
        return ""

    def shutdown(self) -> None:
        """Called once at exit, after pending syncs drained; release resources."""

    # --- per turn ------------------------------------------------------------------
    @abstractmethod
    def prefetch(self, query: str, ctx: ProviderContext) -> Recall:
        """Called at most once per turn, before the first LLM request, with the
        user's text (never for trivial prompts). Fast; return ``Recall("")`` when
        nothing is relevant."""

    def queue_prefetch(self, query: str, ctx: ProviderContext) -> None:
        """Called after a turn, in the background: warm a cache for the next one."""

    def sync_turn(self, user_text: str, assistant_text: str, ctx: ProviderContext) -> None:
        """Called after a turn completed, in the background (PRIMARY only)."""

    @abstractmethod
    def get_tool_schemas(self) -> Sequence[ToolSchema]:
        """Called once after ``initialize``. Names must be unique across providers;
        keep the list stable (tool definitions are part of the cached prefix)."""

    @abstractmethod
    def handle_tool_call(self, name: str, args: Mapping[str, Any], ctx: ProviderContext) -> str:
        """Called for the model's calls to one of this provider's tools. Returns a JSON
        string; report bad arguments in it rather than raising."""

    # --- optional hooks --------------------------------------------------------------
    def on_turn_start(self, turn: int, message: str, ctx: ProviderContext) -> None:
        """Called at the start of each turn with the 1-based user turn number."""

    def on_session_end(self, messages: Messages, ctx: ProviderContext) -> None:
        """Called when a session ends (/reset, rollover) with its messages."""

    def on_session_switch(self, previous_session_id: str, ctx: ProviderContext) -> None:
        """Called when the chat moves to a new session (``ctx.session_id``)."""

    def on_pre_compress(self, messages: Messages, ctx: ProviderContext) -> None:
        """Called before compression with the messages about to be summarised away.
        With ``checkpoint_version = 2`` a return means they are durably captured and
        raising stops the compression (it is retried later)."""

    def on_memory_write(self, write: MemoryWrite, ctx: ProviderContext) -> None:
        """Called after a successful built-in memory write (add/replace/remove)."""

    def on_delegation(self, task: str, result: str, ctx: ProviderContext) -> None:
        """Called when a delegated sub-task finished, with its task and result."""

    def use_journal(self, journal: DocumentJournal | None) -> None:
        """Called before ``initialize`` with the memory journal's write port, for a
        provider that stores locally and journals its writes (``memory/journal.py``)."""

    # --- operations ----------------------------------------------------------------
    def backup_paths(self, home: Path) -> Sequence[Path]:
        """Files or folders under ``home`` that ``mnemo export`` must include."""
        return ()

    def get_config_schema(self) -> Sequence[ConfigField]:
        """The settings ``mnemo providers setup`` asks for."""
        return ()

    def save_config(self, values: Mapping[str, Any], home: Path) -> Path:
        """Validate ``values`` against the schema and persist them under
        ``home / "providers" / name`` (secret fields separately, never exported).
        Raises ``ProviderError`` naming the bad field."""
        return write_provider_config(home, self.name, self.get_config_schema(), values)
