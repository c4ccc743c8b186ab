"""Voice notes and audio to text: an OpenAI-compatible ``/v1/audio/transcriptions``
endpoint (``transcription.url``, e.g. a self-hosted Whisper server; bearer
``transcription.api_key``), called with aiohttp. The transcript becomes the turn's text,
marked as transcribed, so it is stored and searchable like anything typed."""

from __future__ import annotations

import aiohttp

from mnemo.gateway.config import TranscriptionSettings

TRANSCRIBED = "[voice message, transcribed]"
NOT_SET_UP = "Voice messages are not set up on this bot (no transcription server) — please send text."
NOTICE_INTERVAL_S = 3600.0  # the "not set up" reply, at most once per chat per hour


class TranscriptionError(Exception):
    pass


def endpoint(url: str) -> str:
    """``http://host:9000`` or ``…/v1`` or the full ``…/v1/audio/transcriptions``."""
    url = url.rstrip("/")
    if url.endswith("/audio/transcriptions"):
        return url
    if url.endswith("/v1"):
        return url + "/audio/transcriptions"
    return url + "/v1/audio/transcriptions"


async def transcribe(settings: TranscriptionSettings, audio: bytes, *, filename: str, media_type: str) -> str:
    if settings.url is None:
        raise TranscriptionError("transcription.url is not set")
    form = aiohttp.FormData()
    form.add_field("file", audio, filename=filename or "voice.ogg", content_type=media_type or "audio/ogg")
    form.add_field("model", settings.model)
    form.add_field("response_format", "json")
    headers = {}
    if settings.api_key is not None:
        headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
    timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.post(endpoint(settings.url), data=form, headers=headers) as response,
        ):
            if response.status != 200:
                raise TranscriptionError(f"HTTP {response.status}: {(await response.text())[:200]}")
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise TranscriptionError(f"{type(e).__name__}: {e}") from e
    text = body.get("text") if isinstance(body, dict) else None
    if not isinstance(text, str):
        raise TranscriptionError("the answer has no text")
    return text.strip()
