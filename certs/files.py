"""The certificate directory layout and atomic writes.

A serving directory holds ``ca.crt``, ``tls.crt`` and ``tls.key`` (the names of a ``kubernetes.io/tls``
Secret mounted as a volume). A CA directory holds ``ca.crt`` and ``ca.key``; it may be the same directory.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from certs.authority import DEFAULT_CA_DAYS, Authority, CertificateError, PemPair, generate_ca, load_ca

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
CLIENT_CERT = "client.crt"
CLIENT_KEY = "client.key"

CERT_MODE = 0o644
KEY_MODE = 0o600


@dataclass(frozen=True)
class ServingBundle:
    """What a TLS Secret carries: the CA certificate and the serving pair, PEM encoded."""

    ca_cert: bytes
    cert: bytes
    key: bytes


def write_atomic(path: Path, data: bytes, *, mode: int = CERT_MODE) -> None:
    """Replace ``path`` with ``data`` so that readers see either the old or the new file, never a mix.

    The temporary file gets its final mode before any byte is written, so a key is never readable by others.
    """
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def read_ca(ca_dir: Path) -> Authority | None:
    """The CA stored in ``ca_dir``, or None when the directory holds none."""
    cert_path, key_path = ca_dir / CA_CERT, ca_dir / CA_KEY
    if not cert_path.exists() and not key_path.exists():
        return None
    if not key_path.exists():
        raise CertificateError(f"{cert_path} exists but {key_path} does not; cannot sign with this CA")
    if not cert_path.exists():
        raise CertificateError(f"{key_path} exists but {cert_path} does not")
    return load_ca(cert_path.read_bytes(), key_path.read_bytes())


def write_ca(ca_dir: Path, ca: Authority) -> None:
    ca_dir.mkdir(parents=True, exist_ok=True)
    pem = ca.to_pem()
    write_atomic(ca_dir / CA_KEY, pem.key, mode=KEY_MODE)
    write_atomic(ca_dir / CA_CERT, pem.cert, mode=CERT_MODE)


def ensure_ca(
    ca_dir: Path, *, regenerate: bool = False, days: int = DEFAULT_CA_DAYS
) -> tuple[Authority, bool]:
    """The CA in ``ca_dir``, generating and storing a new one when there is none or when asked to.

    Returns the CA and whether it was newly generated.
    """
    if not regenerate:
        existing = read_ca(ca_dir)
        if existing is not None:
            return existing, False
    ca = generate_ca(days=days)
    write_ca(ca_dir, ca)
    return ca, True


def write_serving(out_dir: Path, ca_cert: bytes, pair: PemPair) -> None:
    """Write ``ca.crt``, ``tls.key`` and ``tls.crt``, the certificate last.

    A reader that polls between the two renames sees a certificate and key that do not match; the reloader
    rejects such a pair and picks up the complete one on its next poll.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / CA_CERT, ca_cert, mode=CERT_MODE)
    write_atomic(out_dir / TLS_KEY, pair.key, mode=KEY_MODE)
    write_atomic(out_dir / TLS_CERT, pair.cert, mode=CERT_MODE)


def write_client(out_dir: Path, pair: PemPair) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / CLIENT_KEY, pair.key, mode=KEY_MODE)
    write_atomic(out_dir / CLIENT_CERT, pair.cert, mode=CERT_MODE)


def read_serving(cert_dir: Path) -> ServingBundle:
    """Read the three files of a serving directory; a missing one is a CertificateError naming it."""
    contents: dict[str, bytes] = {}
    for name in (CA_CERT, TLS_CERT, TLS_KEY):
        path = cert_dir / name
        try:
            contents[name] = path.read_bytes()
        except FileNotFoundError as exc:
            raise CertificateError(f"missing {path}") from exc
    return ServingBundle(ca_cert=contents[CA_CERT], cert=contents[TLS_CERT], key=contents[TLS_KEY])
