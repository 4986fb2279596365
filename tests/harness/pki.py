"""Certificates for the test control plane: CAs, serving and client leaves, the ServiceAccount signing key.

EC P-256 keys, a week of validity, written as PEM files (keys 0600) for the processes to read.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class CertPair:
    cert: Path
    key: Path


def _pki():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    return x509, hashes, serialization, ec, rsa, ExtendedKeyUsageOID, NameOID


def _write_key(key, path: Path) -> None:
    _, _, serialization, *_ = _pki()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def make_ca(directory: Path, name: str, common_name: str) -> tuple[CertPair, Any, Any]:
    x509, hashes, serialization, ec, _, _, NameOID = _pki()
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _dt.datetime.now(_dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair, cert, key


def make_leaf(
    directory: Path,
    name: str,
    ca_cert,
    ca_key,
    common_name: str,
    organizations: Iterable[str] = (),
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    server: bool = False,
    client: bool = False,
) -> CertPair:
    x509, hashes, serialization, ec, _, EKU, NameOID = _pki()
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    # RFC 5280 caps a CN at 64 characters, but ServiceAccount user names are longer (system:serviceaccount:
    # tensor-fusion-sys:tensor-fusion-scheduler has 66) and kube-apiserver takes the CN as it is.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name, _validate=len(common_name) <= 64))
    now = _dt.datetime.now(_dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
        )
    )
    usages = ([EKU.SERVER_AUTH] if server else []) + ([EKU.CLIENT_AUTH] if client else [])
    builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    sans = [x509.DNSName(d) for d in dns_names] + [
        x509.IPAddress(ipaddress.ip_address(i)) for i in ip_addresses
    ]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair


def make_service_account_key(directory: Path) -> tuple[Path, Path]:
    _, _, serialization, _, rsa, _, _ = _pki()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv, pub = directory / "sa.key", directory / "sa.pub"
    _write_key(key, priv)
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return priv, pub
