"""The TensorFusionCluster -> GPUPool derivation: TensorFusion's rule, plus hand edits and bad entries, and
the conditions of its status."""

from __future__ import annotations

from typing import Any

import pytest

from extender.controllers.tfcluster import derive
from tests.unit.fixtures.tfcluster import BIG, DEFAULT, HASH, MANAGED_BY, SHARED, cluster, derived


def verbs(plan: derive.Plan) -> list[tuple[str, str]]:
    return [(a.verb.value, a.name) for a in plan.actions]


def test_two_entries_become_two_pools_named_labelled_annotated_and_owned_as_tensorfusion_does() -> None:
    c = cluster(("shared", True, SHARED), ("big", False, BIG), labels={"team": "ml"})
    plan = derive.plan(c, [])
    assert verbs(plan) == [("create", "tf-shared"), ("create", "tf-big")]
    shared = plan.actions[0].body
    assert shared["metadata"]["labels"] == {MANAGED_BY: "tf", "team": "ml"}
    assert shared["metadata"]["annotations"][DEFAULT] == "true"
    assert plan.actions[1].body["metadata"]["annotations"][DEFAULT] == "false"
    assert shared["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "TensorFusionCluster",
            "name": "tf",
            "uid": "c-uid",
            "controller": True,
        }
    ]
    assert shared["spec"] == SHARED and shared["spec"] is not SHARED
    assert plan.problems == []


@pytest.mark.parametrize(
    ("case", "pools", "expected", "reason_part"),
    [
        ("in step", lambda c: [derived(c, "shared", SHARED, is_default=True)], [], None),
        (
            "template changed",
            lambda c: [derived(c, "shared", {"schedulingConfigTemplate": "old"}, is_default=True)],
            [("update", "tf-shared")],
            "spec from specTemplate",
        ),
        (
            "edited by hand",
            lambda c: [
                derived(c, "shared", {"schedulingConfigTemplate": "mine"}, is_default=True, template=SHARED)
            ],
            [("overwrite", "tf-shared")],
            "edited by hand",
        ),
        (
            "made by TensorFusion (no hash)",
            lambda c: [
                {
                    **derived(c, "shared", {"x": 1}, is_default=True),
                    "metadata": {**derived(c, "shared", {})["metadata"], "annotations": {DEFAULT: "true"}},
                }
            ],
            [("update", "tf-shared")],
            "spec from specTemplate",
        ),
        (
            "isDefault changed",
            lambda c: [derived(c, "shared", SHARED, is_default=False)],
            [("update", "tf-shared")],
            f"{DEFAULT}=true",
        ),
        (
            "managed-by label removed",
            lambda c: [
                {
                    **derived(c, "shared", SHARED, is_default=True),
                    "metadata": {**derived(c, "shared", SHARED, is_default=True)["metadata"], "labels": {}},
                }
            ],
            [("update", "tf-shared")],
            f"{MANAGED_BY}=tf",
        ),
        (
            "entry removed",
            lambda c: [derived(c, "shared", SHARED, is_default=True), derived(c, "gone", BIG)],
            [("delete", "tf-gone")],
            "entry is gone",
        ),
        (
            "another cluster's pool is not deleted",
            lambda c: [
                derived(c, "shared", SHARED, is_default=True),
                derived(cluster(name="other"), "x", BIG),
            ],
            [],
            None,
        ),
    ],
)
def test_existing_pools(
    case: str, pools: Any, expected: list[tuple[str, str]], reason_part: str | None
) -> None:
    c = cluster(("shared", True, SHARED))
    plan = derive.plan(c, pools(c))
    assert verbs(plan) == expected, case
    if reason_part is not None:
        assert reason_part in plan.actions[0].reason, case
    for action in plan.actions:
        if action.verb in (derive.Verb.UPDATE, derive.Verb.OVERWRITE):
            body = action.body
            assert body["spec"] == SHARED and "status" not in body
            assert body["metadata"]["resourceVersion"] == "7"  # a PUT that loses to a concurrent edit
            assert body["metadata"]["annotations"][HASH] == derive.template_hash(SHARED)
            assert body["metadata"]["labels"][MANAGED_BY] == "tf"


def test_an_update_keeps_what_others_wrote_on_the_pool() -> None:
    c = cluster(("shared", True, SHARED))
    pool = derived(c, "shared", {"schedulingConfigTemplate": "old"}, is_default=True)
    pool["metadata"]["labels"]["team"] = "ml"
    pool["metadata"]["annotations"]["tensor-fusion.ai/manual-compaction"] = "2026-01-01T00:00:00Z"
    (action,) = derive.plan(c, [pool]).actions
    assert action.body["metadata"]["labels"] == {MANAGED_BY: "tf", "team": "ml"}
    assert (
        action.body["metadata"]["annotations"]["tensor-fusion.ai/manual-compaction"] == "2026-01-01T00:00:00Z"
    )


def test_the_hash_ignores_key_order() -> None:
    assert derive.template_hash({"a": 1, "b": {"c": 2, "d": 3}}) == derive.template_hash(
        {"b": {"d": 3, "c": 2}, "a": 1}
    )
    assert derive.template_hash({"a": 1}) != derive.template_hash({"a": 2})


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        ([{"isDefault": True, "specTemplate": {}}], "spec.gpuPools[0].name: missing"),
        ([{"name": "Shared_Pool", "specTemplate": {}}], "not a valid object name"),
        (
            [{"name": "a", "specTemplate": {}}, {"name": "a", "specTemplate": {"x": 1}}],
            "used by an earlier entry",
        ),
        (["text"], "spec.gpuPools[0]: expected an object"),
        ([{"name": "a", "specTemplate": "text"}], "specTemplate: expected an object"),
    ],
)
def test_bad_entries_are_reported_by_index_and_the_rest_still_derived(
    entries: list[Any], problem: str
) -> None:
    c = cluster(("ok", False, SHARED))
    c["spec"]["gpuPools"] = (
        [*entries, {"name": "ok", "specTemplate": SHARED}]
        if problem != "used by an earlier entry"
        else [*entries]
    )
    plan = derive.plan(c, [])
    assert any(problem in p for p in plan.problems), plan.problems
    assert all(a.verb is derive.Verb.CREATE for a in plan.actions)


def test_a_same_named_pool_the_cluster_does_not_own_is_left_alone_and_reported() -> None:
    c = cluster(("shared", True, SHARED))
    foreign = {"metadata": {"name": "tf-shared", "labels": {}}, "spec": {"x": 1}}
    plan = derive.plan(c, [foreign])
    assert plan.actions == []
    assert plan.problems == [
        "GPUPool tf-shared exists and is not owned by TensorFusionCluster tf; it is left "
        "alone (delete it, or rename the entry)"
    ]


def test_a_pool_of_an_earlier_cluster_of_the_same_name_is_not_ours() -> None:
    c = cluster(("shared", True, SHARED), uid="new")
    old = derived(cluster(("shared", True, SHARED), uid="old"), "shared", SHARED, is_default=True)
    assert derive.plan(c, [old]).problems and not derive.plan(c, [old]).actions


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    first = derive.set_condition([], {"type": "Ready", "status": "True", "reason": "CheckPassed"}, "T1")
    same = derive.set_condition(first, {"type": "Ready", "status": "True", "reason": "CheckPassed"}, "T2")
    flipped = derive.set_condition(same, {"type": "Ready", "status": "False", "reason": "X"}, "T3")
    assert [c["lastTransitionTime"] for c in (*first, *same, *flipped)] == ["T1", "T1", "T3"]


