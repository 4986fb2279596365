"""The dependency floors, the lowest-versions constraints and the hashed locks stay in step."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.unit.fixtures import ROOT

REQUIREMENT = re.compile(r"^([A-Za-z0-9_.-]+)\s*(?:\[[^\]]*\])?\s*([^;]*?)\s*(?:;\s*(.*))?$")


def _split(line: str) -> tuple[str, str, str]:
    found = REQUIREMENT.match(line.strip())
    assert found, line
    name, spec, marker = found.groups()
    return name.lower().replace("_", "-"), spec.replace(" ", ""), (marker or "").strip()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


CLOUD_EXTRAS = ("aws", "alibaba")  # Provisioned mode's SDKs: optional, but in the image and the suite


def _runtime() -> list[str]:
    project = _project()
    return [*project["dependencies"], *(r for e in CLOUD_EXTRAS for r in project["optional-dependencies"][e])]


def test_every_runtime_dependency_has_a_floor_and_the_constraints_pin_it() -> None:
    floors = {}
    for requirement in _runtime():
        name, spec, marker = _split(requirement)
        lowest = [part[2:] for part in spec.split(",") if part.startswith(">=")]
        assert lowest, f"{requirement}: give a floor (>=)"
        floors[name] = (lowest[0], marker)
    pinned = {}
    for line in _lines(ROOT / "constraints-lowest.txt"):
        name, spec, marker = _split(line)
        assert spec.startswith("=="), line
        pinned[name] = (spec[2:], marker)
    assert pinned == floors, "constraints-lowest.txt must pin exactly pyproject.toml's floors"


def _locked(path: Path) -> dict[str, str]:
    """name -> version of a hashed lock (uv pip compile --generate-hashes); every pin carries a hash."""
    text = path.read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, spec, _ = _split(line.split(" --hash")[0])
        assert spec.startswith("=="), line[:80]
        assert "--hash=sha256:" in line, f"{path.name}: {name} has no hash"
        out[name] = spec[2:]
    return out


def test_the_locks_pin_every_dependency_with_hashes_within_the_allowed_ranges() -> None:
    runtime = _locked(ROOT / "requirements.lock")
    test = _locked(ROOT / "requirements-test.lock")
    project = _project()
    for requirement, lock in ([(r, runtime) for r in _runtime()]
                              + [(r, test) for r in _runtime()]
                              + [(r, test) for r in project["optional-dependencies"]["test"]]):
        name, spec, _ = _split(requirement)
        if name == project["name"]:  # the test extra's own extras, checked above
            continue
        assert name in lock, f"{name} is not in the lock: renew the locks (docs/development.md#dependencies)"
        version = tuple(int(p) for p in re.findall(r"\d+", lock[name])[:3])
        for part in filter(None, spec.split(",")):
            bound = tuple(int(p) for p in re.findall(r"\d+", part)[:3])
            if part.startswith(">="):
                assert version >= bound, (name, lock[name], part)
            elif part.startswith("<"):
                assert version < bound, (name, lock[name], part)
    # the build backend is locked too: the installs run without build isolation
    for lock in (runtime, test):
        assert {"setuptools", "wheel"} <= set(lock)
    for name, version in runtime.items():  # one resolution: the image runs what the tests ran
        assert test.get(name) == version, (name, version, test.get(name))
