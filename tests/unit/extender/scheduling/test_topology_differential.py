"""Our topology choice against TensorFusion's own ``gputopo`` evaluators, on the same random topologies.

tests/differential/topology_golden.json holds what TensorFusion's evaluators (built from its module at the
pinned commit by tests/differential/generate-topology.sh) chose for every case of
tests/differential/topology_cases.py, run 40 times: where equally good NUMA nodes tie, TensorFusion's pick
comes from Go's map order and varies between runs, so a case can have several answers. Ours must be one of
them, in every case: GPUs and tier.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pytest

from extender.scheduling.topology import Link, Source, TopologyGPU, choose
from tests.differential.topology_cases import cases
from tests.unit.fixtures import ROOT

GOLDEN = json.loads((ROOT / "tests" / "differential" / "topology_golden.json").read_text())
CASES = {c["name"]: c for c in cases()}
THEIRS = {r["name"]: r["answers"] for r in GOLDEN["results"]}


@dataclass(frozen=True)
class _GPU:
    name: str
    uuid: str
    numa_node: int | None
    links: tuple[Link, ...]


def ours(case: dict[str, Any]) -> dict[str, Any]:
    gpus = [_GPU(g["name"], g["uuid"], g["numa"], tuple(Link(p["uuid"], p["tier"], p["bandwidth"])
                                                          for p in g["peers"])) for g in case["gpus"]]
    scores = {g["name"]: g.get("score", 0) for g in case["gpus"]}

    def score(gpu: TopologyGPU) -> float:
        return scores[gpu.name]

    plan = choose(gpus, case["count"], Source(case["source"]), case["prefer_least_damage"],
                  score if case["scored"] else None)
    return {"gpus": list(plan.gpus), "tier": int(plan.tier)}


def test_the_golden_file_was_made_from_these_cases() -> None:
    digest = hashlib.sha256(json.dumps(cases(), sort_keys=True).encode()).hexdigest()
    assert GOLDEN["cases_sha256"] == digest, "cases changed: run tests/differential/generate-topology.sh"
    assert set(THEIRS) == set(CASES)


def test_the_cases_reach_every_tier_and_the_combination_cap() -> None:
    tiers = {a["tier"] for answers in THEIRS.values() for a in answers}
    assert tiers == {0, 1, 2, 3}
    assert any(len(c["gpus"]) >= 12 and 4 <= c["count"] <= len(c["gpus"]) - 4 for c in CASES.values())


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_gpus_and_tier_as_tensorfusion(name: str) -> None:
    assert ours(CASES[name]) in THEIRS[name]
