"""The background skill review (``skill_review`` jobs): after a turn that used at least
``skills.review_min_tool_calls`` tool calls, one request that may keep the procedure as
a skill (instruction and turn selection: ``memory/skills/review.py``). Like flush and
memory review (``housekeeping.py``), it is the conversation's own request, on the
conversation's model, with the instruction appended: it reads the conversation's cache.

* **Enqueued** by :meth:`SkillReview.after_turn`, a turn listener of the gateway, after
  the reply is in the outbox: only for a finished primary turn (never a cron run, never
  a shared room, whose background work speaks for nobody). It counts the turn's tool
  calls from the stored rows, so a turn replayed after a crash enqueues the review it may
  have missed — and, with the turn's last row id as the key, never a second one.
* **Single flight**: at most one queued or running review per session (the queue's
  rule); a turn that qualifies while one is queued is picked up by it, since a review
  looks at every qualifying turn after the last one reviewed (bounded). One that
  qualifies while a review is already running waits for the session's next review.
* **Rights**: the calls run through the tool registry under ``AgentContext.REVIEW`` as
  a background pass — ``skill_manage`` only, ``create`` or ``patch`` of the session
  user's own skills (``gateway/turns/skill_tools.write_owner``); a shared or admin-written
  skill is never edited, patched, deleted or shadowed.
* **Exactly once**: the model's calls are stored in the job's checkpoint before the first
  one runs and each one is marked as it is applied, so a restart resumes instead of
  asking again; ``reviewed_upto`` (the last turn's row id) in the done job is the marker
  every later review starts after.
* **Cost** is added to the session's usage and billed to its user, like the memory
  review's, and shown as upkeep; the repeat guard and ``memory.upkeep``'s limits apply.
* **Policy**: no review after a turn whose memory policy does not let it store, and the
  job reads the policy again when it runs (an ephemeral chat keeps no skills).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mnemo.gateway.budgets.charge import Charge, RequestKind
from mnemo.gateway.budgets.upkeep import Upkeep
from mnemo.gateway.config import Settings
from mnemo.gateway.errors import LLMError
from mnemo.gateway.jobs.housekeeping import TRANSIENT, AdminCheck, conversation_input, session_message
from mnemo.gateway.jobs.loop_guard import LoopGuard
from mnemo.gateway.jobs.queue import DEFAULT_BACKOFF, Job, JobQueue, JobRun
from mnemo.gateway.llm.client import LLMResponse
from mnemo.gateway.logs import get_logger
from mnemo.gateway.turns.agent import AgentDeps, TurnResult
from mnemo.gateway.turns.model_input import ModelInput, with_instruction
from mnemo.gateway.turns.policy import MemoryPolicies
from mnemo.gateway.turns.tools import TurnContext, turn_context
from mnemo.memory.flush import BACKGROUND_TAG
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.sessions import SessionRow
from mnemo.memory.skills import Skill, SkillStore
from mnemo.memory.skills.review import review_instruction, turn_ending, turns_to_review

log = get_logger(__name__)

SKILL_REVIEW = "skill_review"
TOOL = "skill_manage"
MAX_TOKENS = 4096  # a whole SKILL.md fits


class SkillReview:
    """Collaborators: ``agent`` (the LLM, the session store, the tool registry), the
    ``skills`` store (what the user has now), ``access`` (the admin flag of the context)."""

    def __init__(
        self,
        settings: Settings,
        *,
        agent: AgentDeps,
        skills: SkillStore,
        access: AdminCheck,
        policies: MemoryPolicies | None = None,
        upkeep: Upkeep | None = None,
    ) -> None:
        self.policies = policies
        self.upkeep = upkeep  # memory.upkeep: the hourly limit, and upkeep's account
        self.settings = settings
        self.min_tool_calls = settings.skills.review_min_tool_calls
        self.store = agent.store
        self.llm = agent.llm
        self.tools = agent.tools
        self.skills = skills
        self.access = access
        self.media = agent.media
        self._queue: JobQueue | None = None
        self.loop_guard: LoopGuard | None = None  # set by ``register``

    def register(self, queue: JobQueue) -> None:
        self._queue = queue
        self.loop_guard = LoopGuard(
            lambda sid, kind: queue.jobs(session_id=sid, kind=kind),
            self.settings.memory.upkeep.max_runs_without_message,
        )
        queue.register(SKILL_REVIEW, self.review, backoff=DEFAULT_BACKOFF)

    # --- enqueueing -------------------------------------------------------------------
    async def after_turn(self, ctx: TurnContext, result: TurnResult) -> None:
        """The gateway's turn listener: enqueue a review when this turn earned one."""
        if self._queue is None or result.failed or ctx.agent_context is not AgentContext.PRIMARY:
            return
        if not ctx.policy.stores:
            return  # nothing of this turn may be remembered, skills included
        if result.reply_message_id is None or result.requests == 1:
            return  # one request answered without a tool call (0: a replay, count below)
        session = await self.store.get_session(result.session_id)
        if session is None or session_message(session, ()).shared_room:
            return
        turn = turn_ending(await self.store.load_messages(session.id), result.reply_message_id)
        if turn is None or turn.tool_calls < self.min_tool_calls:
            return
        if await self._reviewed_upto(session.id) >= turn.last_id:
            return  # a replayed turn that was reviewed already
        await self._queue.enqueue(
            SKILL_REVIEW, session.id, {"turn": turn.last_id, "tool_calls": turn.tool_calls}
        )

    async def _reviewed_upto(self, session_id: str) -> int:
        assert self._queue is not None
        marks = [
            j.checkpoint.get("reviewed_upto")
            for j in await self._queue.jobs(session_id=session_id, kind=SKILL_REVIEW)
        ]
        return max((m for m in marks if isinstance(m, int)), default=0)

    # --- the job ----------------------------------------------------------------------
    async def review(self, job: Job, run: JobRun) -> None:
        if run.checkpoint.get("reviewed"):
            return
        session = await self.store.get_session(job.session_id)
        if session is None or session.agent_context != AgentContext.PRIMARY.value:
            await run.save(reviewed=True, writes=0)
            return
        rows = await self.store.load_messages(session.id)
        last_user = max((r.id for r in rows if r.role == "user"), default=0)
        if self.loop_guard is not None and not await self.loop_guard.admit(job, run.save, last_user):
            return  # the repeat guard: nothing new said since its last runs
        msg = session_message(session, rows)
        upto = run.checkpoint.get("reviewed_from")
        if not isinstance(upto, int):
            upto = await self._reviewed_upto(session.id)
            await run.save(reviewed_from=upto)  # the same turns again after a restart
        due = turns_to_review(rows, after=upto, min_tool_calls=self.min_tool_calls)
        if msg.shared_room or not due:
            await run.save(reviewed=True, reviewed_upto=upto, writes=0)
            return
        ctx = turn_context(
            msg,
            session_id=session.id,
            chat_key=session.chat_key,
            is_admin=self.access.is_admin(msg.platform, msg.user_id),
            shared_room=False,
            agent_context=AgentContext.REVIEW,
            background=True,
        )
        if self.policies is not None:
            policy = await self.policies.holding(
                platform=msg.platform, chat_id=msg.chat_id, user=msg.speaker, is_group=not msg.is_dm
            )
            ctx = replace(ctx, policy=policy)
        calls = run.checkpoint.get("calls")
        if not isinstance(calls, list):
            calls = await self._ask_for_calls(session, ctx, due)
            if calls is None:
                await run.save(reviewed=True, reviewed_upto=due[-1].last_id, writes=0)
                return
            await run.save(calls=calls, applied=0, writes=0, refused=[])
        applied, writes = int(run.checkpoint.get("applied", 0)), int(run.checkpoint.get("writes", 0))
        refused = list(run.checkpoint.get("refused", []))
        for i in range(applied, len(calls)):
            result = await self.tools.call(TOOL, calls[i], ctx)
            if result.is_error:
                refused.append(result.content[:300])
            else:
                writes += 1
            await run.save(applied=i + 1, writes=writes, refused=refused)
        await run.save(reviewed=True, reviewed_upto=due[-1].last_id)
        log.info(
            "skill_review",
            session=session.id,
            turns=len(due),
            calls=len(calls),
            writes=writes,
            refused=len(refused),
        )

    async def _ask_for_calls(
        self, session: SessionRow, ctx: TurnContext, due: Sequence[Any]
    ) -> list[dict[str, Any]] | None:
        """The model's ``skill_manage`` inputs, or None when the request was rejected."""
        if not self.tools.schemas(AgentContext.REVIEW, only=[TOOL]):
            log.warning("skill_review_without_skill_manage", session=session.id)
            return None
        rows = await self.store.load_messages(session.id)
        conversation = conversation_input(
            session, rows, self.tools, self.settings.llm, media=self.media, label_authors=False
        )
        if TOOL not in {t.get("name") for t in conversation.tools}:
            log.warning("skill_review_without_skill_manage", session=session.id)
            return None
        own, read_only = await asyncio.to_thread(self._skills_now, ctx.speaker)
        ask = review_instruction(due, own=own, read_only=read_only, tag=BACKGROUND_TAG)
        try:
            response = await self._ask(session, ctx, with_instruction(conversation, ask))
        except TRANSIENT:
            raise  # the queue retries after its backoff
        except LLMError as e:
            log.warning("skill_review_failed", session=session.id, error=f"{type(e).__name__}: {e}")
            return None
        # Only skill_manage ever runs, whatever else the conversation's tool set offered.
        return [dict(c.get("input") or {}) for c in response.tool_uses if c.get("name") == TOOL]

    def _skills_now(self, user: UserRef | None) -> tuple[list[tuple[Skill, str]], list[Skill]]:
        """The user's skills the review may patch (with their text), and the rest."""
        mine = self.skills.own(user) if user is not None else []
        own = [(s, self.skills.read(s)) for s in mine if self.skills.written_in_conversation(s)]
        locked = [s for s in mine if not self.skills.written_in_conversation(s)]
        return own, locked + self.skills.shared()

    async def _ask(self, session: SessionRow, ctx: TurnContext, request: ModelInput) -> LLMResponse:
        """After the conversation's cached prefix, on its model (a cache is one model's);
        usage is billed to the session's user and shown as upkeep."""
        charge = Charge(RequestKind.SKILL_REVIEW, ctx.speaker, ctx.is_admin)  # OverBudget: the job waits
        if self.upkeep is not None:
            await self.upkeep.before_request(session.id, RequestKind.SKILL_REVIEW)
        response = await self.llm.create(
            system=request.system,
            messages=request.messages,
            charge=charge,
            tools=request.tools,
            model=self.settings.llm.model,
            max_tokens=MAX_TOKENS,
            cache_last=False,  # the instruction is never repeated
        )
        payer = str(ctx.speaker) if ctx.speaker is not None else None
        await self.store.add_usage(session.id, response.usage, payer=payer)
        if self.upkeep is not None:
            await self.upkeep.record(session.id, RequestKind.SKILL_REVIEW, ctx.speaker, response.usage)
        return response
