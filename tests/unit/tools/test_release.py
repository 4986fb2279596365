"""``make release``'s pure parts: the version, its check, the staged tree that carries it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tools import release


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

