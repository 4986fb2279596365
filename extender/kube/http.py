"""HTTP/1.1 requests over a pool of keep-alive connections: an asyncio protocol per connection, and
httptools (the llhttp parser uvicorn uses) to read the answers.

The extender's API writes are small requests with small answers, a Binding and an Event per bound pod.
aiohttp's client spends two to three times the CPU of this one on each (request and response objects, URL
parsing, cookie, trace and timer hooks): measured side by side through ``AsyncKube.request`` on a loopback
TLS server, 155-185 against 60-80 microseconds per request. This client does what those
calls need and nothing else: one request at a time per connection, bodies of known length, answers with a
length or chunked, no redirects, no compression, no cookies.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from typing import cast

import httptools

# An idle connection older than this is closed rather than reused: the server may be closing it already
# (kube-apiserver keeps idle connections for 90 s; a write to a connection it has just closed has an
# unknown outcome).
IDLE_SECONDS = 30.0
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class ConnectError(Exception):
    """No connection could be made: the request was not sent."""


class ConnectionLost(Exception):
    """The connection broke or the answer could not be read, after the request was (perhaps) sent."""


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    body: bytes


class _Connection(asyncio.Protocol):
    """One connection: a request written whole, its answer parsed as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = time.monotonic()
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Answer] | None = None
        self._reason = b""
        self._body: list[bytes] = []
        self._size = 0
        self._keep_alive = False

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # nothing asked: a server talking out of turn
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ConnectionLost("the server switched protocols"))
        except httptools.HttpParserError as exc:
            # a callback's own refusal comes wrapped in a callback error
            cause = exc.__cause__ or exc.__context__
            self._fail(cause if isinstance(cause, ConnectionLost) else ConnectionLost(f"bad answer: {exc}"))

    def eof_received(self) -> bool | None:
        self.closed = True
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionLost(f"connection closed{f': {exc}' if exc else ''}"))

    # -- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._waiter is None:  # a second answer to one request
            raise ConnectionLost("answer without a request")

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_body(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > MAX_ANSWER_BYTES:
            raise ConnectionLost(f"answer larger than {MAX_ANSWER_BYTES} bytes")
        self._body.append(chunk)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        self._keep_alive = self._parser.should_keep_alive()
        answer = Answer(self._parser.get_status_code(), self._reason.decode("latin-1"), b"".join(self._body))
        self._reason, self._body, self._size = b"", [], 0
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    # -- use -----------------------------------------------------------------------------------

    async def exchange(self, request: bytes, timeout: float) -> Answer:
        """Write ``request`` and wait up to ``timeout`` for its answer; the connection is closed on any
        failure (what it would read next is unknown)."""
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._keep_alive = False
        try:
            self.transport.write(request)
            async with asyncio.timeout(timeout):
                return await self._waiter
        except BaseException:
            self.close()
            raise

    @property
    def reusable(self) -> bool:
        return self._keep_alive and not self.closed and self._waiter is None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()


class ConnectionPool:
    """Up to ``limit`` connections to one server. A request takes an idle connection (the most recently
    used) or opens one; when ``limit`` are busy it waits its turn, unbounded (a queue, not a failure)."""

    def __init__(self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                 server_hostname: str | None = None, limit: int = 32) -> None:
        self.host, self.port = host, port
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()

    async def request(self, request: bytes, *, timeout: float, connect_timeout: float) -> Answer:
        """Send ``request`` (a whole HTTP/1.1 message) and return its answer.

        Raises ``ConnectError`` when no connection could be made (nothing sent), ``ConnectionLost`` or
        ``TimeoutError`` when the answer did not come (the request may have had its effect)."""
        async with self._slots:
            connection = self._idle_connection() or await self._connect(connect_timeout)
            self._busy.add(connection)
            try:
                answer = await connection.exchange(request, timeout)
            finally:
                self._busy.discard(connection)
            if connection.reusable:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
            else:
                connection.close()
            return answer

    def _idle_connection(self) -> _Connection | None:
        horizon = time.monotonic() - IDLE_SECONDS
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and connection.idle_since >= horizon:
                return connection
            connection.close()
        return None

    async def _connect(self, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(
                    _Connection, self.host, self.port, ssl=self._ssl,
                    server_hostname=self._server_hostname if self._ssl is not None else None)
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return connection

    def close(self) -> None:
        for connection in (*self._idle, *self._busy):
            connection.close()
        self._idle.clear()
        self._busy.clear()
