"""The certificate directory: files written with their modes, atomically, and the CA kept unless its
regeneration is asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from certs import authority, files
from certs.authority import CertificateError
from tests.unit.fixtures.certs import ca as ca  # the fixture
from tests.unit.fixtures.certs import file_mode


def test_serving_files_are_written_with_modes(tmp_path: Path, ca: authority.Authority) -> None:
    pair = authority.issue_serving_cert(ca, dns_names=["svc"])
    files.write_serving(tmp_path, ca.cert_pem, pair)
    assert (tmp_path / "ca.crt").read_bytes() == ca.cert_pem
    assert (tmp_path / "tls.crt").read_bytes() == pair.cert
    assert (tmp_path / "tls.key").read_bytes() == pair.key
    assert file_mode(tmp_path / "tls.key") == 0o600
    assert file_mode(tmp_path / "tls.crt") == 0o644
    assert file_mode(tmp_path / "ca.crt") == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]


def test_atomic_write_replaces_the_file(tmp_path: Path) -> None:
    target = tmp_path / "tls.crt"
    files.write_atomic(target, b"old")
    inode = target.stat().st_ino
    files.write_atomic(target, b"new", mode=0o600)
    assert target.read_bytes() == b"new"
    assert target.stat().st_ino != inode  # a new file renamed over the old, not rewritten in place
    assert file_mode(target) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["tls.crt"]


def test_ca_is_reused_unless_regeneration_is_asked(tmp_path: Path) -> None:
    first, created = files.ensure_ca(tmp_path)
    assert created
    assert file_mode(tmp_path / "ca.key") == 0o600
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

