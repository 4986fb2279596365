"""A server ``ssl.SSLContext`` that follows certificate rotation on disk, without a restart.

``serving_context`` builds the context from ``tls.crt`` / ``tls.key``; ``watch_certificates`` polls the two
files and, when they change, loads the new pair into the *same* context. OpenSSL copies the certificate into
each connection when the connection is created, so new handshakes get the new certificate and established
connections keep theirs.

A pair is loaded into the live context only after it loaded cleanly into a scratch context, from a private
in-memory copy of the bytes that were checked: a failed ``load_cert_chain`` can leave a context holding a
certificate without its key, and the files on disk may change again between two reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from cryptography import x509

from certs.authority import CertificateError, PemPair
from certs.files import TLS_CERT, TLS_KEY

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 2.0

# Identity of one file version: device, inode, size, mtime and ctime in nanoseconds.
FileStamp = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class PairStamp:
    cert: FileStamp
    key: FileStamp


def serving_context(cert_dir: Path | str) -> ssl.SSLContext:
    """A TLS 1.2+ server context holding the pair in ``cert_dir``; CertificateError if it does not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_pair(context, read_pair(Path(cert_dir)))
    return context


async def watch_certificates(
    context: ssl.SSLContext, cert_dir: Path | str, interval: float = DEFAULT_INTERVAL
) -> None:
    """Poll ``cert_dir`` every ``interval`` seconds and load a changed pair into ``context``. Runs until
    cancelled.

    The first poll reloads the current files, so a rotation between ``serving_context`` and the start of
    the watch is not missed.
    """
    reloader = CertificateReloader(context, Path(cert_dir))
    while True:
        try:
            reloader.check()
        except Exception:  # the watch must outlive any single bad poll
            log.exception("certificate reload check failed; will retry")
        await asyncio.sleep(interval)


def certificate_reloader(
    context: ssl.SSLContext, cert_dir: Path | str, interval: float = DEFAULT_INTERVAL
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp ``cleanup_ctx`` entry running ``watch_certificates`` for the life of the application:
    ``app.cleanup_ctx.append(certificate_reloader(context, cert_dir))``.
    """

    async def run(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(
            watch_certificates(context, cert_dir, interval), name="certificate-reloader"
        )
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return run


class CertificateReloader:
    """One poll at a time: load the pair when its files changed since the last attempt.

    A pair that fails to load is remembered as attempted, so it is logged once and retried only when the
    files change again (a writer finishing a non-atomic write changes them).
    """

    def __init__(self, context: ssl.SSLContext, cert_dir: Path) -> None:
        self._context = context
        self._cert_dir = cert_dir
        self._attempted: PairStamp | None = None

    def check(self) -> bool:
        """Returns True when a new pair was loaded into the context."""
        try:
            stamp = pair_stamp(self._cert_dir)
        except OSError as exc:
            log.warning("cannot stat certificates in %s, keeping the current one: %s", self._cert_dir, exc)
            return False
        if stamp == self._attempted:
            return False
        first = self._attempted is None
        self._attempted = stamp
        try:
            pair = read_pair(self._cert_dir)
            serial, not_after = load_pair(self._context, pair)
        except (CertificateError, ssl.SSLError, OSError) as exc:
            log.warning(
                "ignoring changed certificate in %s, keeping the current one: %s", self._cert_dir, exc
            )
            return False
        log.log(
            logging.DEBUG if first else logging.INFO,
            "loaded serving certificate from %s: serial %x, expires %s",
            self._cert_dir,
            serial,
            not_after.isoformat(),
        )
        return True


def pair_stamp(cert_dir: Path) -> PairStamp:
    return PairStamp(cert=_file_stamp(cert_dir / TLS_CERT), key=_file_stamp(cert_dir / TLS_KEY))


def read_pair(cert_dir: Path) -> PemPair:
    try:
        return PemPair(cert=(cert_dir / TLS_CERT).read_bytes(), key=(cert_dir / TLS_KEY).read_bytes())
    except OSError as exc:
        raise CertificateError(f"cannot read the serving pair in {cert_dir}: {exc}") from exc


def load_pair(context: ssl.SSLContext, pair: PemPair) -> tuple[int, dt.datetime]:
    """Check ``pair`` in a scratch context, then load it into ``context``; the context is untouched when
    the pair is bad. Returns the certificate's serial number and expiry.
    """
    try:
        certificate = x509.load_pem_x509_certificate(pair.cert)
    except ValueError as exc:
        raise CertificateError(f"certificate is not valid PEM: {exc}") from exc
    not_after = certificate.not_valid_after_utc
    if not_after <= dt.datetime.now(dt.UTC):
        raise CertificateError(f"certificate serial {certificate.serial_number:x} expired at {not_after}")
    with _staged(pair) as (cert_path, key_path):
        scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            scratch.load_cert_chain(cert_path, key_path)
        except (ssl.SSLError, ValueError, OSError) as exc:
            raise CertificateError(f"certificate and key do not load as a pair: {exc}") from exc
        context.load_cert_chain(cert_path, key_path)
    return certificate.serial_number, not_after


@contextlib.contextmanager
def _staged(pair: PemPair) -> Iterator[tuple[str, str]]:
    """Paths to private copies of the pair: anonymous memory files on Linux (works on a read-only root
    filesystem), else a temporary directory only we can read.
    """
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        descriptors = [os.memfd_create(name) for name in (TLS_CERT, TLS_KEY)]
        try:
            for fd, data in zip(descriptors, (pair.cert, pair.key), strict=True):
                _write_all(fd, data)
            yield f"/proc/self/fd/{descriptors[0]}", f"/proc/self/fd/{descriptors[1]}"
        finally:
            for fd in descriptors:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="tf-certs-") as tmp:
        paths = (os.path.join(tmp, TLS_CERT), os.path.join(tmp, TLS_KEY))
        for path, data in zip(paths, (pair.cert, pair.key), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        yield paths


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _file_stamp(path: Path) -> FileStamp:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
