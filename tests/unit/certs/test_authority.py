"""Certificate generation: the CA, serving and client certificates, and what is refused."""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs import authority
from certs.authority import CertificateError
from tests.unit.fixtures.certs import SERVICE, certificate
from tests.unit.fixtures.certs import ca as ca  # the fixture


def _eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_ca_is_a_self_signed_signing_ca(ca: authority.Authority) -> None:
    cert = ca.certificate
    cert.verify_directly_issued_by(cert)
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    assert isinstance(ca.private_key, ec.EllipticCurvePrivateKey)
    assert ca.private_key.curve.name == "secp256r1"


def test_serving_cert_is_signed_by_the_ca_with_sans_and_server_auth(ca: authority.Authority) -> None:
    pair = authority.issue_serving_cert(
        ca, dns_names=[SERVICE, "localhost"], ip_addresses=["127.0.0.1", "::1"], days=30
    )
    cert = certificate(pair.cert)
    cert.verify_directly_issued_by(ca.certificate)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [SERVICE, "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert _eku(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=30) <= lifetime <= dt.timedelta(days=30, minutes=6)
    assert cert.issuer == ca.certificate.subject


def test_serving_cert_passes_full_path_validation(ca: authority.Authority) -> None:
    pair = authority.issue_serving_cert(ca, dns_names=[SERVICE], ip_addresses=["10.0.0.7"])
    store = verification.Store([ca.certificate])
    for subject in (
        x509.DNSName(SERVICE),
        x509.IPAddress(ipaddress.ip_address("10.0.0.7")),
    ):
        verifier = verification.PolicyBuilder().store(store).build_server_verifier(subject)
        chain = verifier.verify(certificate(pair.cert), [])
        assert chain[-1] == ca.certificate
    wrong = verification.PolicyBuilder().store(store).build_server_verifier(x509.DNSName("other"))
    with pytest.raises(verification.VerificationError):
        wrong.verify(certificate(pair.cert), [])


def test_client_cert_carries_user_and_groups(ca: authority.Authority) -> None:
    pair = authority.issue_client_cert(ca, common_name="e2e-admin", groups=["system:masters", "dev"])
    cert = certificate(pair.cert)
    cert.verify_directly_issued_by(ca.certificate)
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["e2e-admin"]
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters", "dev"]
    assert _eku(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_each_certificate_gets_its_own_key_and_serial(ca: authority.Authority) -> None:
    first = authority.issue_serving_cert(ca, dns_names=["a"])
    second = authority.issue_serving_cert(ca, dns_names=["a"])
    assert first.key != second.key
    assert certificate(first.cert).serial_number != certificate(second.cert).serial_number


def test_loaded_ca_signs_like_the_original(ca: authority.Authority) -> None:
    pem = ca.to_pem()
    loaded = authority.load_ca(pem.cert, pem.key)
    pair = authority.issue_serving_cert(loaded, dns_names=["svc"])
    certificate(pair.cert).verify_directly_issued_by(ca.certificate)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "at least one DNS name or IP address"),
        ({"ip_addresses": ["10.0.0.300"]}, "not an IP address: '10.0.0.300'"),
        ({"dns_names": ["bad name"]}, "not a valid DNS name: 'bad name'"),
        ({"dns_names": ["-x.example"]}, "not a valid DNS name"),
        ({"dns_names": ["svc"], "days": 0}, "at least 1 day, got 0"),
        ({"dns_names": ["svc"], "days": 100_000}, "ends after the CA expires"),
    ],
)
def test_bad_serving_input_is_refused(ca: authority.Authority, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(CertificateError, match=message):
        authority.issue_serving_cert(ca, **kwargs)


def test_expired_ca_cannot_sign() -> None:
    long_ago = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    old = authority.generate_ca(days=10, now=long_ago)
    with pytest.raises(CertificateError, match="CA expired"):
        authority.issue_serving_cert(old, dns_names=["svc"])


def test_load_ca_refuses_a_leaf_and_a_foreign_key(ca: authority.Authority) -> None:
    leaf = authority.issue_serving_cert(ca, dns_names=["svc"])
    with pytest.raises(CertificateError, match="not a CA"):
        authority.load_ca(leaf.cert, leaf.key)
    with pytest.raises(CertificateError, match="does not match"):
        authority.load_ca(ca.cert_pem, leaf.key)
    with pytest.raises(CertificateError, match="not valid PEM"):
        authority.load_ca(b"garbage", leaf.key)
