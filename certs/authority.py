"""Certificate authority and certificate issuance, with no I/O.

Keys are ECDSA P-256 signed with SHA-256 throughout: small, fast and accepted by Go (kube-apiserver) and
OpenSSL alike. A CA loaded from PEM may also hold an RSA key (bring-your-own CA); the certificates it
issues still get P-256 keys.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

ORGANIZATION = "tensor-fusion-extender"
DEFAULT_CA_NAME = "tensor-fusion-extender-ca"
DEFAULT_CA_DAYS = 3650
DEFAULT_LEAF_DAYS = 365
# Certificates start slightly in the past so that a peer whose clock lags ours still accepts them.
CLOCK_SKEW = dt.timedelta(minutes=5)
_MAX_CN_LENGTH = 64
_DNS_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"^(?:\*\.)?{_DNS_LABEL}(?:\.{_DNS_LABEL})*$")


class CertificateError(ValueError):
    """Bad input to certificate generation, or PEM data that is not a usable CA."""


@dataclass(frozen=True)
class PemPair:
    """A certificate and its private key, PEM encoded (the key as unencrypted PKCS#8)."""

    cert: bytes
    key: bytes


@dataclass(frozen=True)
class Authority:
    """A CA certificate with the key that signs for it."""

    certificate: x509.Certificate
    private_key: SigningKey

    @property
    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def to_pem(self) -> PemPair:
        return PemPair(cert=self.cert_pem, key=_key_pem(self.private_key))


def generate_ca(
    common_name: str = DEFAULT_CA_NAME, *, days: int = DEFAULT_CA_DAYS, now: dt.datetime | None = None
) -> Authority:
    """A new self-signed CA that may sign leaf certificates only (path length 0)."""
    check_days(days)
    if not common_name or len(common_name) > _MAX_CN_LENGTH:
        raise CertificateError(f"CA common name must be 1..{_MAX_CN_LENGTH} characters, got {common_name!r}")
    start = _now(now) - CLOCK_SKEW
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name, [ORGANIZATION])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + CLOCK_SKEW + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(digital_signature=True, key_cert_sign=True, crl_sign=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(certificate=certificate, private_key=key)


def load_ca(cert_pem: bytes, key_pem: bytes) -> Authority:
    """Parse a CA from PEM and check that it can sign: a CA certificate whose public key matches the key."""
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CertificateError(f"CA certificate is not valid PEM: {exc}") from exc
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"CA key is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertificateError(f"CA key type {type(key).__name__} is not supported (use ECDSA or RSA)")
    if _public_der(key.public_key()) != _public_der(certificate.public_key()):
        raise CertificateError("CA key does not match the CA certificate")
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound as exc:
        raise CertificateError("CA certificate has no basicConstraints extension") from exc
    if not constraints.ca:
        raise CertificateError("certificate is not a CA (basicConstraints CA is false)")
    return Authority(certificate=certificate, private_key=key)


def issue_serving_cert(
    ca: Authority,
    *,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    days: int = DEFAULT_LEAF_DAYS,
    now: dt.datetime | None = None,
) -> PemPair:
    """A TLS server certificate for the given DNS names and IP addresses, signed by ``ca``."""
    names = [check_dns_name(name) for name in dns_names]
    ips = [parse_ip(address) for address in ip_addresses]
    if not names and not ips:
        raise CertificateError("a serving certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    sans += [x509.IPAddress(ip) for ip in ips]
    candidates = [*names, *(str(ip) for ip in ips)]
    common_name = next((c for c in candidates if len(c) <= _MAX_CN_LENGTH), ORGANIZATION)
    return _issue(
        ca,
        subject=_name(common_name, [ORGANIZATION]),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=sans,
        days=days,
        now=now,
    )


def issue_client_cert(
    ca: Authority,
    *,
    common_name: str,
    groups: Sequence[str] = (),
    days: int = DEFAULT_LEAF_DAYS,
    now: dt.datetime | None = None,
) -> PemPair:
    """A TLS client certificate; Kubernetes reads CN as the user name and each O as a group."""
    if not common_name or len(common_name) > _MAX_CN_LENGTH:
        raise CertificateError(
            f"client common name must be 1..{_MAX_CN_LENGTH} characters, got {common_name!r}"
        )
    for group in groups:
        if not group:
            raise CertificateError("client organization (group) must not be empty")
    return _issue(
        ca,
        subject=_name(common_name, list(groups)),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        sans=[],
        days=days,
        now=now,
    )


def parse_ip(address: str) -> IPAddress:
    try:
        return ipaddress.ip_address(address.strip())
    except ValueError as exc:
        raise CertificateError(f"not an IP address: {address!r}") from exc


def _issue(
    ca: Authority,
    *,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
    days: int,
    now: dt.datetime | None,
) -> PemPair:
    check_days(days)
    current = _now(now)
    start = current - CLOCK_SKEW
    end = current + dt.timedelta(days=days)
    ca_end = ca.certificate.not_valid_after_utc
    if current >= ca_end:
        raise CertificateError(f"the CA expired at {ca_end.isoformat()}; regenerate the CA")
    if end > ca_end:
        raise CertificateError(
            f"a validity of {days} days ends after the CA expires ({ca_end.isoformat()}); "
            "use fewer days or regenerate the CA"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(start, ca.certificate.not_valid_before_utc))
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_authority_key_id(ca), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    certificate = builder.sign(ca.private_key, hashes.SHA256())
    return PemPair(cert=certificate.public_bytes(serialization.Encoding.PEM), key=_key_pem(key))


def _authority_key_id(ca: Authority) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.private_key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _key_usage(
    *, digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _name(common_name: str, organizations: list[str]) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def check_dns_name(name: str) -> str:
    cleaned = name.strip().rstrip(".")
    if len(cleaned) > 253 or not _DNS_NAME.match(cleaned):
        raise CertificateError(f"not a valid DNS name: {name!r}")
    return cleaned


def check_days(days: int) -> None:
    if days < 1:
        raise CertificateError(f"validity must be at least 1 day, got {days}")


def _now(now: dt.datetime | None) -> dt.datetime:
    if now is None:
        return dt.datetime.now(dt.UTC)
    if now.tzinfo is None:
        raise CertificateError("now must be timezone-aware")
    return now


def _key_pem(key: SigningKey) -> bytes:
    return key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )


def _public_der(key: object) -> bytes:
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        return b""
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
