"""``AiohttpRequest`` raises what PTB's HTTPXRequest raises (the adapter maps those) and
sends the same form: against a local aiohttp server, through PTB's own ``post``."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from telegram import InputFile
from telegram.error import NetworkError, TimedOut
from telegram.request import RequestData
from telegram.request._requestparameter import RequestParameter

from mnemo.adapters.telegram_request import AiohttpRequest


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async def echo(request: web.Request) -> web.Response:
        form = await request.post()
        fields = {k: (v.file.read().decode() if isinstance(v, web.FileField) else v) for k, v in form.items()}
        return web.json_response({"ok": True, "result": fields})

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1)
        return web.json_response({"ok": True, "result": True})

    app = web.Application()
    app.router.add_post("/echo", echo)
    app.router.add_post("/slow", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _data(**params: object) -> RequestData:
    return RequestData([RequestParameter.from_input(k, v) for k, v in params.items()])


async def test_fields_and_files_reach_the_server_as_ptb_sends_them(server: str) -> None:
    async with AiohttpRequest() as req:
        result = await req.post(
            f"{server}/echo", _data(chat_id=42, text="hi", reply_parameters={"message_id": 7})
        )
        assert result == {"chat_id": "42", "text": "hi", "reply_parameters": json.dumps({"message_id": 7})}
        upload = InputFile(b"file body", filename="a.txt")
        files = await req.post(f"{server}/echo", _data(chat_id=1, document=upload))
        assert isinstance(files, dict) and files["chat_id"] == "1"
        assert "file body" in files.values()


async def test_a_slow_answer_is_timed_out(server: str) -> None:
    async with AiohttpRequest(read_timeout=0.2) as req:
        with pytest.raises(TimedOut):
            await req.post(f"{server}/slow", _data(chat_id=1))


async def test_an_unreachable_server_is_a_network_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    async with AiohttpRequest() as req:
        with pytest.raises(NetworkError) as e:
            await req.post(f"http://127.0.0.1:{port}/x", _data(chat_id=1))
        assert not isinstance(e.value, TimedOut) and "aiohttp." in str(e.value)


async def test_a_request_before_initialize_is_refused() -> None:
    with pytest.raises(RuntimeError, match="not initialized"):
        await AiohttpRequest().do_request("http://127.0.0.1:9/x", "POST")
