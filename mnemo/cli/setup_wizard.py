"""The questions of ``mnemo setup`` on a terminal.

Plain prompts (``input``; secrets through ``getpass``, never echoed). Every question
shows what Enter keeps in brackets, so a second run walks through the profile as it
is and changes only what you type. A key or token is checked as soon as it is typed
and asked again when the check fails; nothing is written until the last question
(``setup.finish`` does that).
"""

from __future__ import annotations

import asyncio
import getpass
from collections.abc import Callable

from mnemo.cli import setup_checks
from mnemo.cli.main import CommandError
from mnemo.cli.setup import PAIR_WAIT_S, Plan, candidate, user_list
from mnemo.gateway.config import Settings

Ask = Callable[[str], str]
STEPS = 6


class Wizard:
    def __init__(
        self,
        settings: Settings,
        *,
        ask: Ask = input,
        ask_secret: Ask = getpass.getpass,
        say: Callable[[str], None] = print,
    ) -> None:
        self.settings = settings
        self.ask, self.ask_secret, self.say = ask, ask_secret, say
        self.plan = Plan()

    def run(self) -> Plan:
        self.say(f"mnemo setup — profile {self.settings.home}")
        self.say("Press Enter to keep the value in [brackets]. Nothing is saved until the end.")
        self.model()
        self.telegram()
        self.discord()
        self.people()
        self.memory()
        self.storage()
        return self.plan

    # -- small prompts -----------------------------------------------------------------

    def step(self, n: int, title: str) -> None:
        self.say(f"\n{n}/{STEPS} {title}")

    def yes(self, question: str, default: bool = True) -> bool:
        while True:
            answer = self.ask(f"  {question} [{'Y/n' if default else 'y/N'}]: ").strip().lower()
            if not answer:
                return default
            if answer in ("y", "yes", "n", "no"):
                return answer.startswith("y")
            self.say("  please answer y or n")

    def secret(self, question: str, kept: str | None) -> str:
        shown = f"{kept[:4]}…{kept[-4:]}" if kept and len(kept) > 12 else ("set" if kept else "none")
        return self.ask_secret(f"  {question} [{shown}]: ").strip()

    # -- the steps -----------------------------------------------------------------------

    def model(self) -> None:
        self.step(1, "Model (Anthropic Claude)")
        kept = self.settings.llm.api_key.get_secret_value() if self.settings.llm.api_key else None
        while True:
            key = self.secret("API key (console.anthropic.com → API keys; Enter: keep / skip)", kept)
            if not key:
                if kept is None:
                    self.say("  no key: mnemo runs in local trial mode (scripted replies, web chat only)")
                return
            verdict = asyncio.run(setup_checks.model(candidate(self.settings, {"llm.api_key": key})))
            self.plan.checked("model", verdict)
            self.say(f"  {'✓' if verdict.ok else '✗'} {verdict.detail}")
            if verdict.ok:
                self.plan.env["ANTHROPIC_API_KEY"] = key
                return
            if not self.yes("try another key?"):
                return

    def telegram(self) -> None:
        self.step(2, "Telegram")
        tg = self.settings.telegram
        kept = tg.bot_token.get_secret_value() if tg.bot_token else None
        while True:
            token = self.secret("bot token from @BotFather (Enter: keep / skip)", kept) or kept
            if not token:
                return
            verdict = asyncio.run(setup_checks.telegram(tg.api_base_url, token))
            self.say(f"  {'✓' if verdict.ok else '✗'} {verdict.detail}")
            self.plan.checked("telegram", verdict)
            if verdict.ok:
                break
            if not self.yes("try another token?"):
                return
        if token != kept:
            self.plan.env["TELEGRAM_BOT_TOKEN"] = token
        if self.yes(f"let yourself in: send @{verdict.name} a message from your own Telegram account now?"):
            self.say(f"  waiting up to {PAIR_WAIT_S:.0f} s for your message to @{verdict.name}…")
            sender = asyncio.run(setup_checks.first_sender(tg.api_base_url, token, PAIR_WAIT_S))
            if sender is None:
                self.say(
                    "  no message arrived; you can pair later: message the bot, then mnemo pair approve CODE"
                )
                return
            who = f"telegram:{sender.user_id}"
            if self.yes(f"{sender.name or who} ({who}) wrote: allow them and make them an admin?"):
                self._add("access.allowed", [who])
                self._add("access.admins", [who])
                self.say(f"  ✓ {who} may talk to the bot and is an admin")

    def discord(self) -> None:
        self.step(3, "Discord")
        dc = self.settings.discord
        kept = dc.bot_token.get_secret_value() if dc.bot_token else None
        while True:
            token = self.secret(
                "bot token (discord.com/developers → your app → Bot; Enter: keep / skip)", kept
            )
            if not token:
                return
            verdict = asyncio.run(setup_checks.discord(dc.api_base_url, token))
            self.say(f"  {'✓' if verdict.ok else '✗'} {verdict.detail}")
            self.plan.checked("discord", verdict)
            if verdict.ok:
                self.plan.env["DISCORD_BOT_TOKEN"] = token
                return
            if not self.yes("try again?"):
                return

    def people(self) -> None:
        self.step(4, "Who may talk to the bot")
        now = ", ".join(self.plan.config.get("access.allowed", self.settings.access.allowed)) or "nobody yet"
        self.say(f"  allowed now: {now}; anyone else can ask for a pairing code that an admin approves")
        while True:
            answer = self.ask(
                "  add people, PLATFORM:ID separated by commas (e.g. telegram:12345) []: "
            ).strip()
            try:
                self._add("access.allowed", user_list([answer], "allow"))
                return
            except CommandError as e:
                self.say(f"  {e}")

    def memory(self) -> None:
        from mnemo.cli.provider_status import provider_rows
        from mnemo.cli.providers import prompt_fields
        from mnemo.cli.setup_provider import NONE, check_available, checked_values, provider, reachable
        from mnemo.memory.provider_config import read_provider_config

        self.step(5, "Long-term memory provider (optional; the built-in memory always works)")
        rows = [r for r in provider_rows(self.settings) if r["installed"]]
        for row in rows:
            self.say(f"  {row['name']:<12} {row['description']}")
        current = self.settings.memory.provider or NONE
        while True:
            name = self.ask(f"  provider ({NONE} or a name above) [{current}]: ").strip() or current
            if name == NONE:
                if self.settings.memory.provider is not None:
                    self.plan.config["memory.provider"] = None
                return
            if name not in {r["name"] for r in rows}:
                self.say(f"  {name!r} is not installed here")
                continue
            try:
                fields = tuple(provider(self.settings, name).get_config_schema())
                stored = read_provider_config(self.settings.home, name, fields)
                values = checked_values(
                    self.settings, name, prompt_fields(fields, stored, self.ask, self.ask_secret)
                )
                check_available(self.settings, name, values)
            except CommandError as e:
                self.say(f"  ✗ {e}")
                continue
            ok, detail = asyncio.run(reachable(self.settings, name, values))
            self.say(f"  {'✓' if ok else '✗'} {detail}")
            if not ok and not self.yes("use it anyway? (its writes wait until it answers)", default=False):
                continue
            self.plan.provider = (name, values)
            self.plan.config["memory.provider"] = name
            return

    def storage(self) -> None:
        self.step(6, "Database and backups")
        on_pg = self.settings.database.url is not None
        answer = self.ask(
            f"  database: Enter for {'the PostgreSQL URL set now' if on_pg else 'SQLite (state.db)'}, "
            "or a postgresql://… URL: "
        ).strip()
        if answer:
            if not answer.startswith(("postgresql://", "postgres://")):
                self.say("  not a postgresql:// URL: keeping the current database")
            else:
                self.plan.env["MNEMO_DATABASE_URL"] = answer
        backups = self.settings.backup
        keep = self.yes(
            f"daily verified backups ({backups.schedule}, keeping {backups.keep})?", backups.enabled
        )
        if keep != backups.enabled:
            self.plan.config["backup.enabled"] = keep

    def _add(self, key: str, people: list[str]) -> None:
        if not people:
            return
        section, leaf = key.split(".")
        current = self.plan.config.get(key, getattr(getattr(self.settings, section), leaf))
        self.plan.config[key] = list(dict.fromkeys([*current, *people]))
