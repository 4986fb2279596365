"""``make release``'s pure parts: the version, its check, the staged tree that carries it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tools import imagebuild, release

ROOT = release.ROOT


def test_the_version_is_pyprojects() -> None:
    with open(release.ROOT / "pyproject.toml", "rb") as handle:
        assert release.project_version() == tomllib.load(handle)["project"]["version"]


@pytest.mark.parametrize(("good", "semver"), [
    ("0.1.0", "0.1.0"), ("1.2.3rc1", "1.2.3-rc1"), ("1.2.3.dev4", "1.2.3-dev4"),
    ("1.2.3b2.dev4", "1.2.3-b2.dev4"),
])
def test_release_versions_pass_and_the_chart_gets_their_semver_spelling(good: str, semver: str) -> None:
    assert release.check_version(good) == good
    assert release.chart_version(good) == semver


@pytest.mark.parametrize("bad", ["", "1.2", "v1.2.3", "1.2.3 ", "one", "1.2.3/../x", "1.2.3-rc.1",
                                 "1.2.3+local", "1.2.3.post1"])
def test_other_versions_are_refused(bad: str) -> None:
    with pytest.raises(release.ReleaseError, match="not a release version"):
        release.check_version(bad)


def test_the_staged_tree_is_the_committed_one_with_the_version_stamped(tmp_path: Path) -> None:
    staged = release.stage(release.ROOT, "9.9.9", tmp_path / "stage")
    assert release.project_version(staged) == "9.9.9"
    assert (staged / "Dockerfile").is_file() and (staged / "kubectl_tf" / "cli.py").is_file()
    assert not (staged / ".venv").exists() and not (staged / "dist").exists()
    assert release.project_version() != "9.9.9"  # the checkout is left as it was



def test_the_sbom_lists_every_package_the_image_installs_with_its_hashes() -> None:
    lock = (ROOT / "requirements.lock").read_text()
    doc = release.spdx_from_lock(lock, "1.2.3")
    names = {p["name"]: p for p in doc["packages"]}
    pinned = {m.group(1).lower() for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", lock, re.M)}
    assert set(names) == (pinned - {"setuptools", "wheel"}) | {"tensor-fusion-extender"}
    assert names["tensor-fusion-extender"]["versionInfo"] == "1.2.3"
    aiohttp = names["aiohttp"]
    assert aiohttp["externalRefs"][0]["referenceLocator"] == f"pkg:pypi/aiohttp@{aiohttp['versionInfo']}"
    assert aiohttp["checksums"] and all(len(c["checksumValue"]) == 64 for c in aiohttp["checksums"])
    assert doc["spdxVersion"] == "SPDX-2.3" and len(doc["relationships"]) == len(names)


def test_the_image_build_splits_the_lock_and_strips_pip_from_the_base(tmp_path: Path) -> None:
    blocks = imagebuild.lock_blocks((ROOT / "requirements.lock").read_text())
    assert {"setuptools", "wheel", "numpy", "alibabacloud-tea"} <= set(blocks)
    assert blocks["numpy"].startswith("numpy==") and "--hash=sha256:" in blocks["numpy"]
    assert "aiohttp==" not in blocks["numpy"]
    root = tmp_path / "rootfs"
    kept = [root / "usr/local/lib/python3.11/json/__init__.py", root / "usr/local/bin/python3.11",
            root / "usr/local/lib/python3.11/site-packages/README.txt"]
    gone = [root / "usr/local/lib/python3.11/site-packages/pip/__init__.py",
            root / "usr/local/lib/python3.11/site-packages/setuptools-65.5.1.dist-info/RECORD",
            root / "usr/local/lib/python3.11/site-packages/_distutils_hack/__init__.py",
            root / "usr/local/lib/python3.11/ensurepip/_bundled/pip-24.0-py3-none-any.whl",
            root / "usr/share/python-wheels/setuptools-66.1.1-py3-none-any.whl",
            root / "usr/local/bin/pip3"]
    for path in kept + gone:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash")
    imagebuild.prepare_rootfs(root)
    imagebuild.prepare_rootfs(root)  # twice: one user line
    assert all(p.exists() for p in kept) and not [p for p in gone if p.exists()]
    assert (root / "etc/passwd").read_text().splitlines() == [
        "root:x:0:0:root:/root:/bin/bash", "tensorfusion:x:65532:65532::/nonexistent:/usr/sbin/nologin"]
    assert (root / "etc/group").read_text() == "tensorfusion:x:65532:\n"
    assert "--platform" in imagebuild.platform_flags("arm64")
    assert "manylinux_2_28_aarch64" in imagebuild.platform_flags("arm64")
