"""The console adapter: ``mnemo chat`` — the same pipeline in a terminal.

Platform ``cli``, one DM chat per console user (the user is the operator, an admin).

* On a TTY it is interactive: a prompt, lines typed quickly may be merged into one
  turn by the gateway's debounce like on any chat platform.
* When stdin is not a TTY it is *scripted*: each line is one turn, handled in order,
  the next line is read only after the reply is printed (no debounce merging), slash
  commands work, and end of input ends the run after the last reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TextIO

from mnemo.adapters.terminal import printable
from mnemo.gateway.events import ChatRef, ChatType, InboundMessage, OutboundMessage, delivery_label
from mnemo.gateway.logs import get_logger
from mnemo.gateway.ports import CommandInfo, InboundSink

log = get_logger(__name__)

PROMPT = "you> "


class ConsoleAdapter:
    name = "cli"
    max_message_len = 1_000_000
    supports_typing = False

    def __init__(
        self,
        user: str,
        *,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        interactive: bool | None = None,
        transcript: bool = False,
        stderr: TextIO | None = None,
    ) -> None:
        self.user = user
        self._in = stdin or sys.stdin
        self._out = stdout or sys.stdout
        self._err = stderr or sys.stderr
        self._lines = 0  # lines read, for the notes about undecodable input
        self.failed = False  # the reader stopped on an error (``mnemo chat`` exits 1)
        self.interactive = self._in.isatty() if interactive is None else interactive
        # Scripted runs may print both sides ("you> …" / "mnemo> …"), e.g. for the demo.
        self.transcript = transcript
        self.debounce_s: float | None = None if self.interactive else 0.0
        self._replies: asyncio.Queue[OutboundMessage] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._run_id = uuid.uuid4().hex[:8]
        self._count = 0
        self.finished = asyncio.Event()
        self._connected = False
        self._prompt_shown = False  # "you> " is on screen, waiting for a line

    @property
    def connected(self) -> bool:
        return self._connected

    async def start(self, sink: InboundSink, commands: Sequence[CommandInfo] = ()) -> None:
        self._connected = True
        if self._task is None:
            self._task = asyncio.create_task(self._read_loop(sink), name="console-reader")

    async def stop(self) -> None:
        self._connected = False
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def send(self, message: OutboundMessage) -> list[str]:
        marks = delivery_label(message)
        prefix = f"{marks} " if marks else ""
        text = printable(message.text)  # a reply never drives the terminal (ESC, CR, ...)
        if self.interactive:
            # The reader already shows the next "you> " prompt: the reply replaces that
            # line and the prompt comes back under it, never left dangling above it.
            erase = "\r\x1b[K" if self._prompt_shown else "\n"
            again = PROMPT if self._prompt_shown else ""
            self._out.write(f"{erase}mnemo> {prefix}{text}\n\n{again}")
        elif self.transcript:
            self._out.write(f"mnemo> {prefix}{text}\n\n")
        else:
            self._out.write(f"{prefix}{text}\n\n")
        self._out.flush()
        self._replies.put_nowait(message)
        return [f"cli-{self._count}"]

    @contextlib.asynccontextmanager
    async def typing(self, chat: ChatRef) -> AsyncIterator[None]:
        yield

    def _message(self, text: str) -> InboundMessage:
        self._count += 1
        return InboundMessage(
            platform=self.name,
            chat_id=self.user,
            user_id=self.user,
            user_name=self.user,
            message_id=f"{self._run_id}-{self._count}",
            text=text,
            chat_type=ChatType.DM,
        )

    async def _readline(self) -> str:
        if self.interactive:
            self._out.write(PROMPT)
            self._out.flush()
            self._prompt_shown = True
        # Bytes, decoded here one line at a time: a text stream would raise on the
        # first undecodable byte and end the whole run.
        source = getattr(self._in, "buffer", self._in)
        raw: str | bytes = await asyncio.to_thread(source.readline)
        self._prompt_shown = False
        self._lines += 1
        if isinstance(raw, bytes):
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as e:
                self._note(
                    f"line {self._lines} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
                )
                return raw.decode("utf-8", errors="replace")
        if any(0xD800 <= ord(ch) <= 0xDFFF for ch in raw):  # surrogateescape'd bytes
            self._note(f"line {self._lines} holds undecodable bytes")
            return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in raw)
        return raw

    def _note(self, what: str) -> None:
        self._err.write(f"mnemo chat: {what}; the undecodable bytes were replaced with U+FFFD\n")
        self._err.flush()

    async def _read_loop(self, sink: InboundSink) -> None:
        try:
            while True:
                line = await self._readline()
                if line == "":
                    break
                text = line.rstrip("\n").strip()
                if not text:
                    continue
                if self.transcript:
                    self._out.write(f"you>   {text}\n")
                await sink(self._message(text))
                if not self.interactive:
                    await self._replies.get()  # the next line only after the reply
            if self.interactive:
                self._out.write("\n")
        except Exception as e:  # loop boundary: report, then end the run
            self.failed = True
            log.exception("console_reader_failed")
            self._err.write(f"mnemo chat: stopped reading input: {printable(str(e)) or type(e).__name__}\n")
        finally:
            self.finished.set()
