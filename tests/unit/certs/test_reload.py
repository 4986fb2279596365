"""Hot reload of the serving certificate: a real aiohttp HTTPS server keeps answering while the certificate
on disk rotates, and new connections get the new certificate."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from cryptography import x509

from certs import authority, files
from certs.authority import CertificateError
from certs.reload import CertificateReloader, certificate_reloader, serving_context, watch_certificates

INTERVAL = 0.05
TIMEOUT = 10.0


@dataclass
class Site:
    cert_dir: Path
    ca: authority.Authority
    port: int
    client_context: ssl.SSLContext


def _rotate(site_dir: Path, ca: authority.Authority) -> int:
    """Write a new serving pair and return its serial."""
    pair = _issue(ca)
    files.write_serving(site_dir, ca.cert_pem, pair)
    return x509.load_pem_x509_certificate(pair.cert).serial_number


def _issue(ca: authority.Authority) -> authority.PemPair:
    return authority.issue_serving_cert(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], days=2)


def _serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


@pytest.fixture
def cert_dir(tmp_path: Path) -> Path:
    ca, _ = files.ensure_ca(tmp_path)
    files.write_serving(tmp_path, ca.cert_pem, _issue(ca))
    return tmp_path


@pytest_asyncio.fixture
async def site(cert_dir: Path) -> AsyncIterator[Site]:
    async def ping(_request: web.Request) -> web.Response:
        return web.Response(text="pong")

    context = serving_context(cert_dir)
    app = web.Application()
    app.router.add_get("/ping", ping)
    app.cleanup_ctx.append(certificate_reloader(context, cert_dir, interval=INTERVAL))
    runner = web.AppRunner(app)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await tcp.start()
    port = runner.addresses[0][1]
    ca = files.read_ca(cert_dir)
    assert ca is not None
    client_context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    try:
        yield Site(cert_dir=cert_dir, ca=ca, port=port, client_context=client_context)
    finally:
        await runner.cleanup()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "certificate-reloader"]


class Connection:
    """One keep-alive HTTPS connection, with the serial of the certificate the server presented."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        self.serial = x509.load_der_x509_certificate(der).serial_number

    @classmethod
    async def open(cls, site: Site) -> Connection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", site.port, ssl=site.client_context), TIMEOUT
        )
        return cls(reader, writer)

    async def get(self) -> str:
        self.writer.write(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await self.writer.drain()
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        status, *headers = head.decode().split("\r\n")
        assert status.startswith("HTTP/1.1 200"), status
        length = next(int(h.split(":")[1]) for h in headers if h.lower().startswith("content-length:"))
        return (await self.reader.readexactly(length)).decode()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await self.writer.wait_closed()


async def _new_connection_serial(site: Site) -> int:
    connection = await Connection.open(site)
    try:
        assert await connection.get() == "pong"
        return connection.serial
    finally:
        await connection.close()


async def _wait_for_serial(site: Site, serial: int) -> None:
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while await _new_connection_serial(site) != serial:
        assert asyncio.get_running_loop().time() < deadline, "the server never presented the new certificate"
        await asyncio.sleep(INTERVAL)


async def _settle() -> None:
    """Long enough for several polls of the reloader."""
    await asyncio.sleep(INTERVAL * 6)


@pytest.mark.asyncio
async def test_rotated_certificate_is_served_without_restart(site: Site) -> None:
    old_serial = _serial((site.cert_dir / "tls.crt").read_bytes())
    established = await Connection.open(site)
    assert established.serial == old_serial
    assert await established.get() == "pong"

    # Clients keep opening connections and sending requests through the rotation.
    stop = asyncio.Event()
    served: list[int] = []

    async def load() -> None:
        while not stop.is_set():
            served.append(await _new_connection_serial(site))

    traffic = asyncio.create_task(load())
    await asyncio.sleep(INTERVAL * 2)
    new_serial = _rotate(site.cert_dir, site.ca)
    await _wait_for_serial(site, new_serial)
    await asyncio.sleep(INTERVAL * 2)
    stop.set()
    await asyncio.wait_for(traffic, TIMEOUT)  # re-raises any failed request

    assert served and set(served) <= {old_serial, new_serial}
    assert served[-1] == new_serial
    # The connection opened before the rotation is untouched and still served.
    assert await established.get() == "pong"
    assert established.serial == old_serial
    await established.close()


@pytest.mark.asyncio
async def test_broken_files_are_ignored_and_the_old_certificate_kept(site: Site) -> None:
    old_serial = _serial((site.cert_dir / "tls.crt").read_bytes())

    files.write_atomic(site.cert_dir / "tls.crt", b"-----BEGIN CERTIFICATE-----\ntruncat")
    await _settle()
    assert await _new_connection_serial(site) == old_serial

    new_serial = _rotate(site.cert_dir, site.ca)
    await _wait_for_serial(site, new_serial)


@pytest.mark.asyncio
async def test_half_rotated_pair_is_ignored_until_complete(site: Site) -> None:
    old_serial = _serial((site.cert_dir / "tls.crt").read_bytes())
    pair = _issue(site.ca)

    # A new certificate next to the old key: loading it must not break the live context.
    files.write_atomic(site.cert_dir / "tls.crt", pair.cert)
    await _settle()
    assert await _new_connection_serial(site) == old_serial

    files.write_atomic(site.cert_dir / "tls.key", pair.key, mode=files.KEY_MODE)
    await _wait_for_serial(site, _serial(pair.cert))


def test_reloader_loads_only_changed_valid_pairs(cert_dir: Path) -> None:
    context = serving_context(cert_dir)
    reloader = CertificateReloader(context, cert_dir)
    assert reloader.check()  # the first poll loads what is on disk
    assert not reloader.check()  # unchanged

    ca = files.read_ca(cert_dir)
    assert ca is not None
    _rotate(cert_dir, ca)
    assert reloader.check()
    assert not reloader.check()

    files.write_atomic(cert_dir / "tls.key", b"not a key", mode=files.KEY_MODE)
    assert not reloader.check()
    assert not reloader.check()  # a bad pair is tried once per change

    (cert_dir / "tls.key").unlink()
    assert not reloader.check()  # missing file: logged, kept


def test_serving_context_refuses_a_bad_pair(cert_dir: Path) -> None:
    (cert_dir / "tls.key").write_bytes(b"garbage")
    with pytest.raises(CertificateError, match="do not load as a pair"):
        serving_context(cert_dir)
    (cert_dir / "tls.key").unlink()
    with pytest.raises(CertificateError, match="cannot read"):
        serving_context(cert_dir)


def test_serving_context_refuses_an_expired_certificate(tmp_path: Path) -> None:
    import datetime as dt

    ca = authority.generate_ca(now=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    old = authority.issue_serving_cert(
        ca, dns_names=["svc"], days=1, now=dt.datetime(2000, 1, 2, tzinfo=dt.UTC)
    )
    files.write_serving(tmp_path, ca.cert_pem, old)
    with pytest.raises(CertificateError, match="expired"):
        serving_context(tmp_path)


@pytest.mark.asyncio
async def test_watch_is_cancellable(cert_dir: Path) -> None:
    task = asyncio.create_task(watch_certificates(serving_context(cert_dir), cert_dir, interval=INTERVAL))
    await asyncio.sleep(INTERVAL * 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
