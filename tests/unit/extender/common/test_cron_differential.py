"""The cron grammar and ``Next`` against TensorFusion's own: robfig/cron v3.0.1 with the parser options of
TensorFusion's ``internal/autoscaler/recommender/cron_recommender.go`` (robfig's ``parser.go`` and
``spec.go``), and TensorFusion's CronRecommender run at chosen instants.

tests/differential/golden_cron.json is what TensorFusion's Go code answered on ``cron_cases()`` of
tests/differential/cases.py (made by tests/differential/generate.sh): whether each expression is accepted,
the next firing of expressions in five zones (daylight-saving changes of New York and Berlin among them),
and the rule each tick finds active with the recommendation and condition reason.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.differential.cases import cron_cases
from tests.differential.ours import cron_accepts, cron_next, run_cron_case
from tests.unit.fixtures import ROOT

GOLDEN = json.loads((ROOT / "tests" / "differential" / "golden_cron.json").read_text())
CASES = cron_cases()
THEIRS = GOLDEN["results"]


def test_the_golden_file_was_made_from_these_cases() -> None:
    digest = hashlib.sha256(json.dumps(CASES, sort_keys=True).encode()).hexdigest()
    assert GOLDEN["cases_sha256"] == digest, "cases.py changed: run tests/differential/generate.sh"


def test_the_cases_reach_both_answers() -> None:
    assert 40 < sum(THEIRS["parse"]) < len(THEIRS["parse"]) - 30
    assert any(n is None for n in THEIRS["next"])
    reasons = {t["reason"] for c in THEIRS["cases"] for t in c["ticks"]}
    assert {"RuleActive", "RuleInactive"} <= reasons


def test_every_expression_is_accepted_or_refused_as_tensorfusion_does() -> None:
    differ = [(e, theirs) for e, theirs in zip(CASES["parse"], THEIRS["parse"], strict=True)
              if cron_accepts(e) != theirs]
    assert differ == []


def test_every_next_firing_is_robfigs() -> None:
    differ = [(c, theirs) for c, theirs in zip(CASES["next"], THEIRS["next"], strict=True)
              if cron_next(c) != theirs]
    assert differ == []


@pytest.mark.parametrize("index", range(len(CASES["cases"])), ids=[c["name"] for c in CASES["cases"]])
def test_every_tick_of_the_cron_recommender_is_tensorfusions(index: int) -> None:
    ours = run_cron_case(CASES["cases"][index])
    theirs = THEIRS["cases"][index]["ticks"]
    assert [(i, o) for i, (o, t) in enumerate(zip(ours, theirs, strict=True)) if o != t] == []
