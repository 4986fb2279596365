"""The extender's HTTP/1.1 client for API writes: answers of every framing the API server uses, connection
reuse and its limits, and which failures leave a request's outcome unknown. The servers here are raw
asyncio servers, so each test controls the exact bytes (aiohttp's server would frame answers its own way)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from extender.kube.http import MAX_ANSWER_BYTES, ConnectError, ConnectionLost, ConnectionPool

Reply = Callable[[bytes], Awaitable[bytes | None]]  # request bytes -> answer bytes (None: close)


class RawServer:
    """Reads one request at a time (head and Content-Length body) and writes what ``reply`` returns."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.close_after_answer = False

    async def start(self, context: ssl.SSLContext | None = None) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=context)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = await self.reply(request)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after_answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def answer(status: int, body: bytes, *extra: str) -> bytes:
    headers = "".join(f"{h}\r\n" for h in extra)
    return f"HTTP/1.1 {status} Reason\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body


def chunked(status: int, *pieces: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return f"HTTP/1.1 {status} OK\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + body


def request(path: str = "/x", body: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


async def with_server(reply: Reply, *, limit: int = 4,
                      context: tuple[ssl.SSLContext, ssl.SSLContext] | None = None
                      ) -> tuple[RawServer, ConnectionPool]:
    server = RawServer(reply)
    port = await server.start(context[0] if context else None)
    pool = ConnectionPool("127.0.0.1", port, limit=limit, ssl_context=context[1] if context else None)
    return server, pool


@pytest.mark.parametrize(("reply", "status", "body"), [
    (answer(201, b'{"kind":"Status"}'), 201, b'{"kind":"Status"}'),
    (answer(204, b""), 204, b""),
    (chunked(200, b'{"kind":', b'"Pod"', b"}"), 200, b'{"kind":"Pod"}'),
    (answer(409, b'{"message":"already assigned"}'), 409, b'{"message":"already assigned"}'),
])
async def test_answers_are_read_whatever_their_framing(reply: bytes, status: int, body: bytes) -> None:
    async def fixed(_: bytes) -> bytes:
        return reply

    server, pool = await with_server(fixed)
    try:
        got = await pool.request(request(body=b"{}"), timeout=5, connect_timeout=5)
    finally:
        pool.close()
        await server.close()
    assert (got.status, got.body) == (status, body)
    assert server.requests == [request(body=b"{}")]


async def test_an_answer_split_into_many_reads_is_joined() -> None:
    big = b"x" * 300_000

    async def slow(_: bytes) -> bytes:
        return chunked(200, *(big[i:i + 7_000] for i in range(0, len(big), 7_000)))

    server, pool = await with_server(slow)
    try:
        got = await pool.request(request(), timeout=5, connect_timeout=5)
    finally:
        pool.close()
        await server.close()
    assert got.body == big


async def test_requests_reuse_an_idle_connection_and_open_at_most_the_limit() -> None:
    gate = asyncio.Event()

    async def held(_: bytes) -> bytes:
        await gate.wait()
        return answer(200, b"{}")

    server, pool = await with_server(held, limit=3)
    try:
        waiting = [asyncio.create_task(pool.request(request(), timeout=5, connect_timeout=5))
                   for _ in range(10)]
        await asyncio.sleep(0.2)
        assert server.connections == 3 and len(server.requests) == 3  # the other seven queue
        gate.set()
        results = await asyncio.gather(*waiting)
        for _ in range(5):
            await pool.request(request(), timeout=5, connect_timeout=5)
    finally:
        pool.close()
        await server.close()
    assert [r.status for r in results] == [200] * 10
    assert server.connections == 3 and len(server.requests) == 15


async def test_connection_close_is_honoured_and_the_next_request_reconnects() -> None:
    async def closing(_: bytes) -> bytes:
        return answer(200, b"{}", "Connection: close")

    server, pool = await with_server(closing)
    try:
        for _ in range(3):
            assert (await pool.request(request(), timeout=5, connect_timeout=5)).status == 200
    finally:
        pool.close()
        await server.close()
    assert server.connections == 3


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def ok(_: bytes) -> bytes:
        return answer(200, b"{}")  # says keep-alive, then the server closes anyway (its idle timeout)

    server, pool = await with_server(ok)
    server.close_after_answer = True
    try:
        for _ in range(3):
            assert (await pool.request(request(), timeout=5, connect_timeout=5)).status == 200
            await asyncio.sleep(0.05)  # the close arrives while the connection is idle
    finally:
        pool.close()
        await server.close()
    assert server.connections == 3 and len(server.requests) == 3


@pytest.mark.parametrize("reply", [
    None,  # closed without an answer
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}",  # closed inside the body
    b"NOT HTTP AT ALL\r\n\r\n",  # not an HTTP answer
])
async def test_no_whole_answer_is_connection_lost(reply: bytes | None) -> None:
    async def broken(_: bytes) -> bytes | None:
        if reply is None:
            return None
        return reply

    server, pool = await with_server(broken)
    server.close_after_answer = True
    try:
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(pool.request(request(), timeout=2, connect_timeout=2), 5)
    except TimeoutError:
        pytest.fail("the request hung instead of failing")
    finally:
        pool.close()
        await server.close()
    assert pool._idle == []


async def test_no_answer_in_time_is_a_timeout_and_the_connection_is_dropped() -> None:
    async def never(_: bytes) -> bytes:
        await asyncio.sleep(30)
        return answer(200, b"{}")

    server, pool = await with_server(never)
    try:
        with pytest.raises(TimeoutError):
            await pool.request(request(), timeout=0.2, connect_timeout=2)
    finally:
        pool.close()
        await server.close()
    assert pool._idle == [] and pool._busy == set()


async def test_an_answer_past_the_size_limit_is_refused() -> None:
    async def endless(_: bytes) -> bytes:
        piece = b"y" * 1_000_000
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        return head + b"".join(b"%x\r\n%s\r\n" % (len(piece), piece)
                               for _ in range(MAX_ANSWER_BYTES // len(piece) + 2))

    server, pool = await with_server(endless)
    try:
        with pytest.raises(ConnectionLost, match="larger than"):
            await pool.request(request(), timeout=10, connect_timeout=2)
    finally:
        pool.close()
        await server.close()


async def test_a_refused_connection_is_a_connect_error() -> None:
    server = RawServer(lambda _: asyncio.sleep(0, answer(200, b"")))
    port = await server.start()
    await server.close()  # the port is free again: connecting is refused
    pool = ConnectionPool("127.0.0.1", port)
    with pytest.raises(ConnectError):
        await pool.request(request(), timeout=1, connect_timeout=1)


def _tls(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "api")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("api")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                    serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    client = ssl.create_default_context(cafile=str(tmp / "cert.pem"))
    return server, client


async def test_tls_verifies_the_servers_name(tmp_path: Path) -> None:
    async def ok(_: bytes) -> bytes:
        return answer(200, b'{"ok":true}')

    contexts = _tls(tmp_path)
    server = RawServer(ok)
    port = await server.start(contexts[0])
    good = ConnectionPool("127.0.0.1", port, ssl_context=contexts[1], server_hostname="api")
    wrong = ConnectionPool("127.0.0.1", port, ssl_context=contexts[1], server_hostname="other")
    try:
        assert (await good.request(request(), timeout=5, connect_timeout=5)).body == b'{"ok":true}'
        with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await wrong.request(request(), timeout=5, connect_timeout=5)
    finally:
        good.close()
        wrong.close()
        await server.close()
