"""A fake OpenAI-compatible speech-to-text server: ``POST /v1/audio/transcriptions``
(multipart ``file``, ``model``), answering ``{"text": …}`` from a table keyed by the
uploaded bytes; it records what it got and checks the bearer key when one is set."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

from aiohttp import web


@dataclass
class Upload:
    filename: str
    content_type: str
    model: str
    authorization: str


@dataclass
class FakeTranscriber:
    transcripts: dict[bytes, str] = field(default_factory=dict)
    api_key: str | None = None
    uploads: list[Upload] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp's TCPSite has a server once started
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _transcribe(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if self.api_key is not None and auth != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        form = await request.post()
        upload = form["file"]
        assert isinstance(upload, web.FileField)
        audio = upload.file.read()
        self.uploads.append(Upload(upload.filename, upload.content_type, str(form.get("model", "")), auth))
        if audio not in self.transcripts:
            return web.json_response({"error": {"message": "could not decode audio"}}, status=400)
        return web.json_response({"text": self.transcripts[audio]})
