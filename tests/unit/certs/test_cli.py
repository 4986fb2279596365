"""``tf-certs generate``: the files a user gets, their certificates, and the messages of bad input."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from certs import authority, files
from certs.cli import main
from tests.unit.fixtures import ROOT
from tests.unit.fixtures.certs import SERVICE, certificate, file_mode
from tests.unit.fixtures.certs import ca as ca  # the fixture


def test_cli_generate_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "serving"
    argv = ["generate", "--out-dir", str(out), "--dns", SERVICE, "--dns", "localhost"]
    argv += ["--ip", "127.0.0.1", "--days", "7"]
    assert main([*argv, "--client-cn", "e2e-admin", "--client-org", "system:masters"]) == 0
    assert "generated CA" in capsys.readouterr().out
    ca_pem = (out / "ca.crt").read_bytes()
    serving = certificate((out / "tls.crt").read_bytes())
    ca_cert = certificate(ca_pem)
    serving.verify_directly_issued_by(ca_cert)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [SERVICE, "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    client = certificate((out / "client.crt").read_bytes())
    client.verify_directly_issued_by(ca_cert)
    assert client.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    for key in ("tls.key", "client.key", "ca.key"):
        assert file_mode(out / key) == 0o600

    # Second run: same CA, new serving certificate.
    assert main(argv) == 0
    assert "reused CA" in capsys.readouterr().out
    assert (out / "ca.crt").read_bytes() == ca_pem
    assert certificate((out / "tls.crt").read_bytes()).serial_number != serving.serial_number


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
        (["generate", "--out-dir", "{tmp}", "--ip", "nope"], 2, "'nope' is not an IP address"),
        (["generate", "--out-dir", "{tmp}", "--dns", "a b"], 2, "not a valid DNS name"),
        (["generate", "--out-dir", "{tmp}", "--dns", "a", "--days", "0"], 2, "of at least 1"),
        (["generate", "--out-dir", "{tmp}", "--dns", "a", "--days", "x"], 2, "'x' is not a number of days"),
        (["generate", "--out-dir", "{tmp}", "--dns", "a", "--client-org", "g"], 2, "needs --client-cn"),
        (["secret", "--namespace", "n", "--name", "s", "--cert-dir", "{tmp}"], 1, "missing"),
        (["patch-webhook", "--name", "w", "--ca-file", "{tmp}/none.crt"], 1, "none.crt: no such file"),
        (["frobnicate"], 2, "invalid choice"),
        ([], 2, "required"),
    ],
)
def test_cli_bad_input_fails_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    assert main([arg.replace("{tmp}", str(tmp_path)) for arg in argv]) == code
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    if code == 2 and argv[:1] == ["generate"]:  # a usage error writes nothing
        assert not any(tmp_path.iterdir())


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

