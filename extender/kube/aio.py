"""A non-blocking API client for the extender's writes: raw JSON requests on the event loop.

Requests go through one keep-alive connection pool (``extender.kube.http``), watches through an
``aiohttp`` session, both created on first use inside the running loop. Address, credentials and TLS
come from the same ``kubernetes.client.Configuration`` the list calls use (a kubeconfig or the
in-cluster service account), so all agree on where and who they are. The bearer token is read through
the configuration on every request, so a refreshed in-cluster token is picked up. Errors are raised as
the client library's ``ApiException`` so ``error_status`` and ``error_message`` read them alike.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
import orjson
from kubernetes import client

from extender.kube.client import ApiException
from extender.kube.http import ConnectError, ConnectionLost, ConnectionPool

# HTTP/1.1 carries one request per connection at a time, so this bounds the writes in flight at the API
# server; more wait their turn for a connection (a queue, not a failure). Measured in the benchmark's
# variants (QUICK, load average 12-23 on 2 cores, so rough): on a starved API server 128 in flight bound
# 2.5 pods/s with most requests past their timeout, 32 bound 8 pods/s and 8 bound 6.5 pods/s; on a busy
# but not starved one 8 left binds queueing (p50 11 s against 0.5 s with more connections).
POOL_SIZE = 32


class UnknownOutcome(Exception):
    """The request may or may not have taken effect (timeout, connection lost after sending)."""


class NotSent(Exception):
    """The request never left: no connection (refused, or none free in time). Safe to send again."""


def ssl_context(configuration: client.Configuration) -> ssl.SSLContext | bool:
    """The TLS settings of ``configuration``: its CA, client certificate and verification choice."""
    if not str(configuration.host).startswith("https"):
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None,
                                         cadata=getattr(configuration, "ca_cert_data", None) or None)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    return context


class AsyncKube:
    def __init__(self, configuration: client.Configuration, *, pool_size: int = POOL_SIZE) -> None:
        self.configuration = configuration
        self.host = str(configuration.host).rstrip("/")
        self.pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._pool: ConnectionPool | None = None
        self._ssl = ssl_context(configuration)
        address = urlsplit(self.host)
        self._authority = address.netloc
        self._prefix = address.path.rstrip("/")  # a server behind a path (host "https://proxy/k8s")
        self._address = (address.hostname or "localhost",
                         address.port or (443 if address.scheme == "https" else 80))

    @classmethod
    def from_api_client(cls, api_client: client.ApiClient, **kwargs: Any) -> AsyncKube:
        return cls(api_client.configuration, **kwargs)

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "tf-extender"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        # kubeconfig and in-cluster tokens live under "BearerToken"; "authorization" is its alias
        token = self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        elif self.configuration.username or self.configuration.password:
            headers["Authorization"] = str(self.configuration.get_basic_auth_token())
        return headers

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.pool_size, ssl=self._ssl, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(connector=connector, json_serialize=json.dumps)
        return self._session

    def _pool_now(self) -> ConnectionPool:
        if self._pool is None:
            self._pool = ConnectionPool(
                *self._address, ssl_context=self._ssl if isinstance(self._ssl, ssl.SSLContext) else None,
                server_hostname=getattr(self.configuration, "tls_server_name", None) or None,
                limit=self.pool_size)
        return self._pool

    def _message(self, method: str, path: str, query: Mapping[str, str] | None, body: bytes | None,
                 content_type: str) -> bytes:
        target = f"{self._prefix}{path}?{urlencode(query)}" if query else f"{self._prefix}{path}"
        if not target.startswith("/") or any(c in target for c in " \r\n"):
            raise ValueError(f"not a request path: {target[:200]!r}")
        head = f"{method} {target} HTTP/1.1\r\nHost: {self._authority}\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in self._headers(content_type if body is not None else None
                                                                     ).items())
        if body is None:
            return f"{head}\r\n".encode("latin-1")
        return f"{head}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body

    async def request(self, method: str, path: str, *, body: Any = None,
                      content_type: str = "application/json", timeout: float = 30.0,
                      query: Mapping[str, str] | None = None) -> Any:
        """Send one request, answer its decoded JSON body.

        Raises ``ApiException`` for an answer other than 2xx, ``UnknownOutcome`` when the request was
        sent but no answer came (a write may then have happened), and ``NotSent`` when it could not be
        sent at all. Waiting for a free pooled connection is not limited (a queue, not a failure);
        opening one is, and so is the wait for the answer (``timeout`` each).
        """
        message = self._message(method, path, query, None if body is None else orjson.dumps(body),
                                content_type)
        try:
            answer = await self._pool_now().request(message, timeout=timeout, connect_timeout=timeout)
        except ConnectError as exc:
            raise NotSent(f"{method} {path}: not sent ({exc})") from exc
        except (TimeoutError, ConnectionLost) as exc:
            raise UnknownOutcome(f"{method} {path}: no answer ({type(exc).__name__}: {exc})") from exc
        if not 200 <= answer.status <= 299:
            raise ApiException(status=answer.status, reason=answer.reason,
                               body=answer.body.decode(errors="replace"))
        return orjson.loads(answer.body) if answer.body else None

    async def stream(self, path: str, *, query: Mapping[str, str], read_timeout: float,
                     connect_timeout: float = 5.0) -> AsyncIterator[bytes]:
        """The body of a long GET (a watch), in the pieces it arrives in.

        Raises ``ApiException`` when the answer is not 2xx; a broken connection raises aiohttp's own
        errors (a read, so nothing to find out about). ``read_timeout`` bounds each wait for data.
        """
        session = self._session_now()
        limits = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        async with session.get(self.host + path, params=query, headers=self._headers(None), timeout=limits,
                               server_hostname=getattr(self.configuration, "tls_server_name", None) or None,
                               ) as response:
            if not 200 <= response.status <= 299:
                raw = await response.read()
                raise ApiException(status=response.status, reason=response.reason,
                                   body=raw.decode(errors="replace"))
            async for chunk in response.content.iter_any():
                yield chunk

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None
