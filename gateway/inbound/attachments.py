"""A turn's attachments, made into what the model reads (``gateway/media.py``).

``prepare`` downloads each attachment the platform can fetch (at most
``MAX_ATTACHMENTS_PER_TURN``, each within ``MEDIA_TIMEOUT_S``) and turns it into stored
references for the user message (images, PDFs) and text for the turn (inlined files,
transcribed voice, notes). A failure is a note for that attachment; the turn goes on.

Voice without a transcription server: a batch of nothing but voice is not a turn at
all; its chat is told "not set up" at most once per ``NOTICE_INTERVAL_S``
(``voice_notice_due``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mnemo.gateway.config import TranscriptionSettings
from mnemo.gateway.events import Attachment, ChatRef, InboundMessage
from mnemo.gateway.logs import get_logger
from mnemo.gateway.media import MAX_ATTACHMENTS_PER_TURN, MAX_DOWNLOAD_BYTES, Prepared
from mnemo.gateway.media import note as media_note
from mnemo.gateway.ports import Adapter, FetchesMedia
from mnemo.gateway.transcription import NOTICE_INTERVAL_S as VOICE_NOTICE_INTERVAL_S
from mnemo.gateway.transcription import TRANSCRIBED, TranscriptionError, transcribe

log = get_logger(__name__)

MEDIA_TIMEOUT_S = 60.0  # one attachment's download
VOICE_KINDS = frozenset({"voice", "audio"})


class MediaPreparer(Protocol):
    """Downloaded bytes → references and text (``MediaStore.take``), within the sender's
    ``media.quota``; never raises for what is in the file."""

    async def take(self, owner: str, kind: str, name: str, media_type: str, data: bytes) -> Prepared: ...


@dataclass(frozen=True, slots=True)
class PreparedMedia:
    refs: list[dict[str, Any]] = field(default_factory=list)  # for the user message's meta
    text: str = ""


class TurnMedia:
    def __init__(
        self,
        adapters: Mapping[str, Adapter],
        store: MediaPreparer | None,
        transcription: TranscriptionSettings,
    ) -> None:
        self.adapters = adapters
        self.store = store
        self.transcription = transcription
        self._voice_noticed: dict[ChatRef, float] = {}  # chat -> when "voice is not set up" was said

    def voice_unavailable(self, batch: Sequence[InboundMessage]) -> bool:
        """Nothing but voice in the batch, and no transcription server to read it."""
        atts = [a for m in batch for a in m.attachments]
        return self.transcription.url is None and bool(atts) and all(a.kind in VOICE_KINDS for a in atts)

    def voice_notice_due(self, chat: ChatRef) -> bool:
        """Whether to say "voice is not set up" in ``chat`` now (once per interval)."""
        now = time.monotonic()
        last = self._voice_noticed.get(chat)
        if last is not None and now - last < VOICE_NOTICE_INTERVAL_S:
            return False
        self._voice_noticed[chat] = now
        return True

    async def prepare(self, batch: Sequence[InboundMessage]) -> PreparedMedia:
        wanted = [(m, a) for m in batch for a in m.attachments if a.ref]
        if not wanted or self.store is None:
            return PreparedMedia()
        refs: list[dict[str, Any]] = []
        texts: list[str] = []
        for m, a in wanted[:MAX_ATTACHMENTS_PER_TURN]:
            prepared = await self._one(
                self.adapters.get(m.platform), f"{m.platform}:{m.user_id}", a, self.store
            )
            refs.extend(prepared.refs)
            if prepared.text:
                texts.append(prepared.text)
        skipped = len(wanted) - MAX_ATTACHMENTS_PER_TURN
        if skipped > 0:
            texts.append(
                f"[{skipped} more attachment(s) not read: at most {MAX_ATTACHMENTS_PER_TURN} per message]"
            )
        return PreparedMedia(refs, "\n".join(texts))

    async def _one(
        self, adapter: Adapter | None, owner: str, a: Attachment, store: MediaPreparer
    ) -> Prepared:
        if a.size is not None and a.size > MAX_DOWNLOAD_BYTES:
            return media_note(a.name, "too large (over 20 MB), not read")
        if a.kind in VOICE_KINDS and self.transcription.url is None:
            return media_note(a.name, "a voice message; voice is not set up on this bot")
        if not isinstance(adapter, FetchesMedia):
            return media_note(a.name, "could not be downloaded")
        try:
            async with asyncio.timeout(MEDIA_TIMEOUT_S):
                data = await adapter.fetch_media(a)
        except Exception as e:  # a failed or timed-out download is a note, not a failed turn
            log.warning("media_download_failed", kind=a.kind, error=f"{type(e).__name__}: {e}")
            return media_note(a.name, "the download failed, not read")
        if a.kind in VOICE_KINDS:
            return await self._transcribed(a, data)
        return await store.take(owner, a.kind, a.name, a.media_type, data)

    async def _transcribed(self, a: Attachment, data: bytes) -> Prepared:
        try:
            spoken = await transcribe(self.transcription, data, filename=a.name, media_type=a.media_type)
        except TranscriptionError as e:
            log.warning("transcription_failed", error=str(e))
            return media_note(a.name, "the voice message could not be transcribed")
        return Prepared(text=f"{TRANSCRIBED} {spoken}") if spoken else media_note(a.name, "no speech heard")
