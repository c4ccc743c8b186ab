"""The chat commands: the built-ins plus those of the sub-systems that own them
(cron, skills, usage, link). Their order is the order of /help and the menus."""

from __future__ import annotations

from zoneinfo import ZoneInfo

from mnemo.gateway.budgets.command import usage_command
from mnemo.gateway.budgets.gate import BudgetGate
from mnemo.gateway.commands import Command
from mnemo.gateway.config import Settings
from mnemo.gateway.cron.service import CronJobs
from mnemo.gateway.cron.tool import CronCommand
from mnemo.gateway.inbound.access import AccessControl
from mnemo.gateway.inbound.commands import CommandDeps, CommandRegistry, default_commands
from mnemo.gateway.inbound.memory_command import MemoryStores
from mnemo.gateway.jobs.queue import JobQueue
from mnemo.gateway.people.command import ForgetMe
from mnemo.gateway.people.link_command import AccountNotices, link_command
from mnemo.gateway.storage import StorageBackend
from mnemo.gateway.turns.policy import MemoryPolicies
from mnemo.gateway.turns.skill_tools import SkillsCommand
from mnemo.memory.skills import SkillStore


def build_commands(
    settings: Settings,
    backend: StorageBackend,
    *,
    access: AccessControl,
    jobs: JobQueue,
    budgets: BudgetGate,
    cron: CronJobs,
    skills: SkillStore,
    forget_me: ForgetMe,
    notices: AccountNotices,
    trial: bool,
    policies: MemoryPolicies,
) -> CommandRegistry:
    links = backend.links
    return default_commands(
        CommandDeps(
            store=backend.sessions,
            files=backend.files,
            pairings=access.pairings,
            search=backend.search,
            jobs=jobs,
            search_limit=settings.search.default_limit,
            trial=trial,
            forget_me=forget_me,
            linked_dms=links.linked_dm_keys if settings.search.linked_dms else None,
            memory=MemoryStores(  # /memory history, undo, confirm, policy
                backend.files,
                journal=backend.journal,
                proposals=backend.proposals,
                policies=policies,
                shared_write=settings.memory.shared_write,
            ),
            timezone=ZoneInfo(settings.gateway.timezone),
        ),
        extra=[
            Command(
                "cron", "scheduled jobs: list, add, pause, resume, remove", CronCommand(cron), takes_args=True
            ),
            Command(
                "skills",
                "skills: list; admins: promote NAME PLATFORM:ID",
                SkillsCommand(skills),
                takes_args=True,
            ),
            usage_command(budgets, trial=trial),
            link_command(links, notices),
        ],
    )
