"""python-telegram-bot's HTTP requests over aiohttp (a ``telegram.request.BaseRequest``).

PTB's default ``HTTPXRequest`` spends most of its time in httpcore's pool, which
re-checks every idle connection on each request: with hundreds of chats that was a
large share of the gateway's CPU. aiohttp (a core dependency, also under the web
server and discord.py) keeps a cheaper pool. Only the transport changes: PTB still
builds every request, parses every answer and raises its own errors, so the adapter's
error mapping (``telegram_errors``) sees what it saw before:

* a timeout of any phase → ``telegram.error.TimedOut`` (a wait for a free pooled
  connection says so: the request was not sent);
* any other transport failure → ``telegram.error.NetworkError`` naming the aiohttp error.

Timeouts follow PTB's meaning: ``read`` bounds each wait for data (``getUpdates`` adds
its long-poll timeout to it), ``connect`` the TCP connect, ``pool`` the wait for a
connection of the pool; aiohttp has no write timeout, so a write is bounded by the
read wait that follows it. One session per instance, opened by ``initialize`` and
closed by ``shutdown`` (PTB calls both).
"""

from __future__ import annotations

import aiohttp
from telegram._utils.defaultvalue import DefaultValue
from telegram._utils.types import ODVInput
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData

POOL_SIZE = 256  # PTB's own default for the bot's request object


class AiohttpRequest(BaseRequest):
    def __init__(
        self,
        *,
        pool_size: int = POOL_SIZE,
        read_timeout: float | None = 5.0,
        connect_timeout: float | None = 5.0,
        pool_timeout: float | None = 1.0,
    ) -> None:
        self._pool_size = pool_size
        self._read_timeout = read_timeout
        self._connect_timeout = connect_timeout
        self._pool_timeout = pool_timeout
        self._session: aiohttp.ClientSession | None = None

    @property
    def read_timeout(self) -> float | None:
        return self._read_timeout

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size),
                headers={"User-Agent": self.USER_AGENT},
            )

    async def shutdown(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        write_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        connect_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
        pool_timeout: ODVInput[float] = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        session = self._session
        if session is None or session.closed:
            raise RuntimeError("This AiohttpRequest is not initialized!")
        read = self._read_timeout if isinstance(read_timeout, DefaultValue) else read_timeout
        connect = self._connect_timeout if isinstance(connect_timeout, DefaultValue) else connect_timeout
        pool = self._pool_timeout if isinstance(pool_timeout, DefaultValue) else pool_timeout
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=None if pool is None or connect is None else pool + connect,
            sock_connect=connect,
            sock_read=read,
        )
        try:
            async with session.request(method, url, data=_body(request_data), timeout=timeout) as res:
                return res.status, await res.read()
        except aiohttp.ConnectionTimeoutError as err:
            raise TimedOut(
                message="Pool or connect timeout: the request was *not* sent to Telegram."
            ) from err
        except TimeoutError as err:  # any other phase (aiohttp's are TimeoutErrors)
            raise TimedOut from err
        except aiohttp.ClientError as err:
            raise NetworkError(f"aiohttp.{type(err).__name__}: {err}") from err


def _body(request_data: RequestData | None) -> aiohttp.FormData | None:
    """The form PTB's HTTPXRequest sends: each parameter JSON-encoded as a field, files as
    multipart parts."""
    if request_data is None:
        return None
    files = request_data.multipart_data
    form = aiohttp.FormData(quote_fields=False)
    for name, value in request_data.json_parameters.items():
        form.add_field(name, value)
    for name, part in files.items():
        filename, content, *rest = part
        form.add_field(name, content, filename=filename, content_type=rest[0] if rest else None)
    if not files and not request_data.json_parameters:
        return None
    return form
