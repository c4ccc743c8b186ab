"""The platform-independent pipeline: ``Gateway.submit`` → lane → agent → outbox.

``Gateway`` assembles the pipeline from its parts and runs their lifecycle; each part
is a class of its own, named for its job, with its collaborators passed in:

* ``Submission`` (``submission.py``) — the ordered inbound chain: authorize → rate
  limit → bind log context → persist → dispatch (the order and its reasons are there);
* ``Chats`` (``chats.py``) — session keys, admins, the lanes, what a command may do;
* ``TurnRunner`` (``turn_runner.py``) — what a lane runs for a batch: the budget
  gate, the attachments (``attachments.py``), the agent in the chat's session
  (``agent_turn.py``), the reply, memory before and after (``turn_memory.py``);
* ``Replies`` (``replies.py``) — everything said to a chat, through the outbox;
* ``ScheduledRuns`` (``scheduled.py``) — cron runs through the same agent pipeline;
* ``Health`` (``health.py``) — ``/healthz`` and the gauges.

The delivery loop (``delivery/outbox.py``) sends what the outbox holds. On start,
inbox rows left unfinished by a crash are fed back into their lanes (``recover``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mnemo.gateway.config import Settings
from mnemo.gateway.delivery import Ledgers
from mnemo.gateway.delivery.inbox import InboxRow
from mnemo.gateway.delivery.live import LiveReplies
from mnemo.gateway.delivery.outbox import DeliveryLoop
from mnemo.gateway.events import InboundMessage, Submitted, from_payload
from mnemo.gateway.inbound.access import AccessControl
from mnemo.gateway.inbound.agent_turn import AgentTurn
from mnemo.gateway.inbound.attachments import TurnMedia
from mnemo.gateway.inbound.chats import Chats
from mnemo.gateway.inbound.health import Health
from mnemo.gateway.inbound.lanes import LaneSet, TurnSlots, default_turn_slots
from mnemo.gateway.inbound.queued import Queued
from mnemo.gateway.inbound.replies import Replies
from mnemo.gateway.inbound.scheduled import ScheduledRuns
from mnemo.gateway.inbound.submission import CommandRunner, Submission
from mnemo.gateway.inbound.turn_memory import TurnListener, TurnMemory
from mnemo.gateway.inbound.turn_runner import TurnBudget, TurnRunner
from mnemo.gateway.llm.client import context_window
from mnemo.gateway.logs import get_logger
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.ports import Adapter, NotesUnreadable, ReportsReachability
from mnemo.gateway.turns.agent import AgentDeps, TurnResult
from mnemo.gateway.turns.sessions import JobSink, SessionResolver
from mnemo.memory.journal import ProposalRepository
from mnemo.memory.manager import MemoryManager
from mnemo.memory.search import IndexStatus

log = get_logger(__name__)


class Gateway:
    """The pipeline, assembled. Inputs, each a narrow port or a store: ``sessions``
    (which session, its frozen prompt), ``agent`` (the LLM, the session store and the
    tools a turn's agent is built from), the durable ledgers, access control, the
    command registry, the memory providers, the job queue, metrics, the budget gate."""

    def __init__(
        self,
        settings: Settings,
        *,
        sessions: SessionResolver,
        agent: AgentDeps,
        ledgers: Ledgers,
        access: AccessControl,
        commands: CommandRunner | None = None,
        providers: MemoryManager | None = None,
        jobs: JobSink | None = None,
        metrics: Metrics | None = None,
        budget: TurnBudget | None = None,
        proposals: ProposalRepository | None = None,
        forget_session: Callable[[str], Awaitable[int]] | None = None,
        search_index: Callable[[], Awaitable[IndexStatus]] | None = None,
    ) -> None:
        metrics = metrics or Metrics()
        self.inbox = ledgers.inbox
        self.streams = ledgers.streams
        self.adapters: dict[str, Adapter] = {}
        self._started = False
        # The lanes run the turn runner, which puts a turn that must give way back into
        # them: the handler is looked up when a batch runs.
        self.lanes: LaneSet[Queued] = LaneSet(
            lambda key, batch: self.runner.run(key, batch),
            debounce_s=settings.gateway.debounce_s,
            idle_s=settings.gateway.lane_idle_s,
            debounce_for=self._debounce_for,
            slots=TurnSlots(
                settings.gateway.max_concurrent_turns or default_turn_slots(settings.llm.max_concurrency),
                on_wait=metrics.turn_wait.observe,
            ),
        )
        self.health_report = Health(
            self.adapters,
            self.lanes,
            ledgers.outbox,
            metrics,
            jobs=jobs,
            providers=providers,
            running=lambda: self._started,
            search_index=search_index,
        )
        metrics.on_scrape(self.health_report.refresh_gauges)
        self.delivery = DeliveryLoop(
            ledgers.outbox, self.adapters, on_sent=self.health_report.count_sent, streams=self.streams
        )
        self.replies = Replies(
            ledgers.outbox, self.inbox, self.delivery, self.adapters, admins=settings.access.admins
        )
        self.chats = chats = Chats(
            self.lanes, sessions, access, group_sessions_per_user=settings.sessions.group_sessions_per_user
        )
        self.memory = TurnMemory(
            sessions,
            providers,
            jobs,
            home=settings.home,
            show_recall=settings.memory.show_recall_indicator,
            compression=settings.compression,
            context_window=context_window(settings.llm),
            proposals=proposals,  # what a remember: ask turn asks to keep, under its reply
            forget_session=forget_session,  # history: off chats keep no messages
        )
        self.submission = Submission(access, self.inbox, chats, self.replies, metrics, commands=commands)
        self.runner = TurnRunner(
            chats,
            self.inbox,
            self.replies,
            TurnMedia(self.adapters, agent.media, settings.transcription),
            AgentTurn(
                chats,
                sessions,
                agent,
                self.inbox,
                self.adapters,
                LiveReplies(settings.streaming, self.adapters, self.streams),
                self.memory,
            ),
            self.memory,
            metrics,
            budget=budget,
        )
        self.scheduled = ScheduledRuns(chats, sessions, agent, self.replies)

    # --- lifecycle -------------------------------------------------------------------
    def add_adapter(self, adapter: Adapter) -> None:
        if adapter.name in self.adapters:
            raise ValueError(f"adapter {adapter.name!r} already added")
        self.adapters[adapter.name] = adapter
        if isinstance(adapter, ReportsReachability):
            adapter.on_chat_reachable(self.delivery.chat_reachable)
        if isinstance(adapter, NotesUnreadable):
            adapter.on_unreadable(self.submission.note_unreadable)

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        await self.delivery.start()
        await self.recover()

    async def stop(self, drain_s: float = 5.0) -> None:
        if not self._started:
            return
        self._started = False
        await self.lanes.drain(drain_s)
        await self.lanes.stop()
        await self.delivery.deliver_due()
        await self.delivery.stop()

    async def recover(self, rows: Sequence[InboxRow] | None = None) -> int:
        """Feed inbox rows left unfinished by a crash back into their lanes: at start the
        inbox's ``unfinished()``; on PostgreSQL also the rows adopted from a dead replica
        (``gateway/replicas.py``)."""
        rows = await self.inbox.unfinished() if rows is None else rows
        for row in rows:
            self.chats.enqueue(Queued(row.id, from_payload(dict(row.payload))))
        if rows:
            log.info("inbox_recovered", count=len(rows))
        return len(rows)

    def _debounce_for(self, item: Queued) -> float | None:
        adapter = self.adapters.get(item.msg.platform)
        return adapter.debounce_s if adapter is not None else None

    # --- the entry points the rest of the bot uses -------------------------------------
    async def submit(self, msg: InboundMessage) -> Submitted:
        """Every supported inbound message, from the adapters (``Submission.submit``)."""
        return await self.submission.submit(msg)

    async def run_scheduled(self, msg: InboundMessage, *, deliver: bool = True) -> TurnResult:
        """A cron run (``ScheduledRuns.run``)."""
        return await self.scheduled.run(msg, deliver=deliver)

    async def notify_admins(self, text: str) -> None:
        await self.replies.notify_admins(text)

    def wake_delivery(self) -> None:
        self.delivery.wake()

    async def health(self) -> dict[str, Any]:
        """/healthz: adapters connected and queue depths (``Health.report``)."""
        return await self.health_report.report()

    @property
    def turn_listeners(self) -> list[TurnListener]:
        """Called after every answered turn (``SkillReview``, tests)."""
        return self.memory.listeners
