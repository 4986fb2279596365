"""Certificate generation, the directory layout and the ``tf-certs generate`` command."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs import authority, files
from certs.authority import CertificateError
from certs.cli import main
from tests.unit.fixtures import ROOT

SERVICE = "tf-webhook.tensor-fusion-sys.svc"


@pytest.fixture(scope="module")
def ca() -> authority.Authority:
    return authority.generate_ca()


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- authority -------------------------------------------------------------------------------------------


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
    cert = _cert(pair.cert)
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
        chain = verifier.verify(_cert(pair.cert), [])
        assert chain[-1] == ca.certificate
    wrong = verification.PolicyBuilder().store(store).build_server_verifier(x509.DNSName("other"))
    with pytest.raises(verification.VerificationError):
        wrong.verify(_cert(pair.cert), [])


def test_client_cert_carries_user_and_groups(ca: authority.Authority) -> None:
    pair = authority.issue_client_cert(ca, common_name="e2e-admin", groups=["system:masters", "dev"])
    cert = _cert(pair.cert)
    cert.verify_directly_issued_by(ca.certificate)
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["e2e-admin"]
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters", "dev"]
    assert _eku(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_each_certificate_gets_its_own_key_and_serial(ca: authority.Authority) -> None:
    first = authority.issue_serving_cert(ca, dns_names=["a"])
    second = authority.issue_serving_cert(ca, dns_names=["a"])
    assert first.key != second.key
    assert _cert(first.cert).serial_number != _cert(second.cert).serial_number


def test_loaded_ca_signs_like_the_original(ca: authority.Authority) -> None:
    pem = ca.to_pem()
    loaded = authority.load_ca(pem.cert, pem.key)
    pair = authority.issue_serving_cert(loaded, dns_names=["svc"])
    _cert(pair.cert).verify_directly_issued_by(ca.certificate)


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


# --- files -----------------------------------------------------------------------------------------------


def test_serving_files_are_written_with_modes(tmp_path: Path, ca: authority.Authority) -> None:
    pair = authority.issue_serving_cert(ca, dns_names=["svc"])
    files.write_serving(tmp_path, ca.cert_pem, pair)
    assert (tmp_path / "ca.crt").read_bytes() == ca.cert_pem
    assert (tmp_path / "tls.crt").read_bytes() == pair.cert
    assert (tmp_path / "tls.key").read_bytes() == pair.key
    assert _mode(tmp_path / "tls.key") == 0o600
    assert _mode(tmp_path / "tls.crt") == 0o644
    assert _mode(tmp_path / "ca.crt") == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]


def test_atomic_write_replaces_the_file(tmp_path: Path) -> None:
    target = tmp_path / "tls.crt"
    files.write_atomic(target, b"old")
    inode = target.stat().st_ino
    files.write_atomic(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert target.stat().st_ino != inode  # a new file renamed over the old, not rewritten in place
    assert _mode(target) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["tls.crt"]


def test_ca_is_reused_unless_regeneration_is_asked(tmp_path: Path) -> None:
    first, created = files.ensure_ca(tmp_path)
    assert created
    assert _mode(tmp_path / "ca.key") == 0o600
    again, created = files.ensure_ca(tmp_path)
    assert not created
    assert again.certificate == first.certificate
    fresh, created = files.ensure_ca(tmp_path, regenerate=True)
    assert created
    assert fresh.certificate != first.certificate
    assert files.read_ca(tmp_path) is not None


def test_ca_certificate_without_key_is_an_error(tmp_path: Path, ca: authority.Authority) -> None:
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    with pytest.raises(CertificateError, match=r"ca\.key does not"):
        files.ensure_ca(tmp_path)


def test_read_serving_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CertificateError, match=r"missing .*ca\.crt"):
        files.read_serving(tmp_path)


# --- tf-certs generate -----------------------------------------------------------------------------------


def test_cli_generate_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "serving"
    argv = ["generate", "--out-dir", str(out), "--dns", SERVICE, "--dns", "localhost"]
    argv += ["--ip", "127.0.0.1", "--days", "7"]
    assert main([*argv, "--client-cn", "e2e-admin", "--client-org", "system:masters"]) == 0
    assert "generated CA" in capsys.readouterr().out
    ca_pem = (out / "ca.crt").read_bytes()
    serving = _cert((out / "tls.crt").read_bytes())
    ca_cert = _cert(ca_pem)
    serving.verify_directly_issued_by(ca_cert)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [SERVICE, "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    client = _cert((out / "client.crt").read_bytes())
    client.verify_directly_issued_by(ca_cert)
    assert client.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    for key in ("tls.key", "client.key", "ca.key"):
        assert _mode(out / key) == 0o600

    # Second run: same CA, new serving certificate.
    assert main(argv) == 0
    assert "reused CA" in capsys.readouterr().out
    assert (out / "ca.crt").read_bytes() == ca_pem
    assert _cert((out / "tls.crt").read_bytes()).serial_number != serving.serial_number


def test_cli_generate_with_separate_ca_dir(tmp_path: Path) -> None:
    ca_dir, out = tmp_path / "ca", tmp_path / "out"
    assert main(["generate", "--out-dir", str(out), "--ca-dir", str(ca_dir), "--dns", "svc"]) == 0
    assert sorted(p.name for p in ca_dir.iterdir()) == ["ca.crt", "ca.key"]
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert (out / "ca.crt").read_bytes() == (ca_dir / "ca.crt").read_bytes()


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["generate", "--out-dir", "{tmp}"], 2, "at least one --dns or --ip"),
        (["generate", "--out-dir", "{tmp}", "--ip", "nope"], 1, "not an IP address: 'nope'"),
        (["generate", "--out-dir", "{tmp}", "--dns", "a b"], 1, "not a valid DNS name"),
        (["generate", "--out-dir", "{tmp}", "--dns", "a", "--days", "0"], 1, "at least 1 day"),
        (["generate", "--out-dir", "{tmp}", "--dns", "a", "--days", "x"], 2, "invalid int value"),
        (["generate", "--out-dir", "{tmp}", "--dns", "a", "--client-org", "g"], 2, "needs --client-cn"),
        (["secret", "--namespace", "n", "--name", "s", "--cert-dir", "{tmp}"], 1, "missing"),
        (["patch-webhook", "--name", "w", "--ca-file", "{tmp}/none.crt"], 1, "No such file"),
        (["frobnicate"], 2, "invalid choice"),
        ([], 2, "required"),
    ],
)
def test_cli_bad_input_fails_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    assert main([arg.replace("{tmp}", str(tmp_path)) for arg in argv]) == code
    assert message in capsys.readouterr().err


def test_cli_refuses_to_publish_a_mismatched_pair(
    tmp_path: Path, ca: authority.Authority, capsys: pytest.CaptureFixture[str]
) -> None:
    one = authority.issue_serving_cert(ca, dns_names=["svc"])
    other = authority.issue_serving_cert(ca, dns_names=["svc"])
    files.write_serving(tmp_path, ca.cert_pem, authority.PemPair(cert=one.cert, key=other.key))
    argv = ["secret", "--namespace", "n", "--name", "s", "--cert-dir", str(tmp_path)]
    assert main(argv) == 1
    assert "do not load as a pair" in capsys.readouterr().err


def test_console_entry_point_runs(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "certs", "generate", "--out-dir", str(tmp_path), "--ip", "127.0.0.1"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "tls.crt").exists()
