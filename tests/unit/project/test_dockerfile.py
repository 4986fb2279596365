"""The image's commands are the console scripts the distribution installs."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest
import yaml

from tests.unit.fixtures import ROOT


def _console_scripts() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["scripts"])


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _tf_commands(text: str) -> set[str]:
    """Words tf-<name> that are not the start of a longer name (the object name tf-scheduling-config)."""
    return set(re.findall(r"\b(?:tf-[a-z]+|kubectl-tf|kubectl_complete-tf)\b(?![-.])", text))


def _stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """(FROM's argument, the stage's instructions) for each stage."""
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for keyword, rest in _dockerfile_instructions():
        if keyword == "FROM":
            stages.append((rest, []))
        elif stages:
            stages[-1][1].append((keyword, rest))
    return stages


def test_dockerfile_is_multi_stage_runs_as_non_root_and_needs_no_emulation() -> None:
    """The base pinned by digest; nothing runs on the target's platform (the base's stage and the final one
    have no RUN; the build stage runs on the build machine's), so amd64 and arm64 build anywhere."""
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim@sha256:[0-9a-f]{64}$", text, re.M)
    stages = _stages()
    assert [base for base, _ in stages] == [
        "${BASE_IMAGE} AS base", "--platform=${BUILDPLATFORM} ${BUILD_IMAGE} AS build", "scratch"]
    for base, instructions in stages:
        if "BUILDPLATFORM" not in base:
            assert not [rest for keyword, rest in instructions if keyword == "RUN"], base
    users = [rest for keyword, rest in stages[-1][1] if keyword == "USER"]
    assert users and not users[-1].startswith(("root", "0")), "the runtime user is not root"


def test_dockerfile_checks_every_console_script() -> None:
    checked = set()
    for keyword, rest in _dockerfile_instructions():
        if keyword == "RUN":
            checked |= _tf_commands(rest)
    assert checked == _console_scripts()


@pytest.mark.parametrize("script", sorted(_console_scripts()))
def test_each_console_script_is_installed_and_answers_help(script: str) -> None:
    path = shutil.which(script) or str(ROOT / ".venv" / "bin" / script)
    result = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower()


def test_default_command_and_manifest_commands_are_console_scripts() -> None:
    scripts = _console_scripts()
    cmd = [rest for keyword, rest in _dockerfile_instructions() if keyword == "CMD"][-1]
    assert _tf_commands(cmd) <= scripts and _tf_commands(cmd)
    used_in_manifests: set[str] = set()
    for path in (ROOT / "manifests").rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            used_in_manifests |= _tf_commands(yaml.safe_dump(doc)) if doc else set()
    assert used_in_manifests, "the deployments run the project's console scripts"
    assert used_in_manifests <= scripts
