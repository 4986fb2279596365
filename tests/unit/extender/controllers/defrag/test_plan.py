"""Defragmentation planning: candidates, the reasons a node is left alone, and the placement simulation."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
import yaml

from extender.controllers.defrag.config import parse_config
from extender.controllers.defrag.plan import (
    SkipReason,
    Snapshot,
    candidate_nodes,
    plan_defrag,
    plan_pool,
    pool_nodes,
)
from extender.kube.selectors import selects
from extender.plan_cmd import snapshot_inputs
from extender.planning.action import plan
from extender.scheduling.state import ClusterState
from extender.simulate_cmd import load_cluster
from tests.unit.fixtures.defrag import NOW_TEXT, TF, four_nodes, gpus, node, pdb, pool, room_for_one, worker

NOW = dt.datetime.fromisoformat(NOW_TEXT)


def snapshot_of(objects: list[dict[str, Any]]) -> Snapshot:
    inputs = snapshot_inputs(objects, now=NOW)
    from extender.controllers.defrag.plan import snapshot_of as of_inputs

    return of_inputs(inputs)


def plan_of(objects: list[dict[str, Any]], pool_name: str = "p"):
    state = ClusterState()
    load_cluster(state, objects)
    config = parse_config(next(o for o in objects if o["kind"] == "GPUPool" and
                               o["metadata"]["name"] == pool_name))
    return plan_pool(state, pool_name, config, snapshot_of(objects), NOW), state


def replace_obj(objects: list[dict[str, Any]], kind: str, name: str, new: dict[str, Any] | None
                ) -> list[dict[str, Any]]:
    out = [o for o in objects if not (o["kind"] == kind and o["metadata"]["name"] == name)]
    return out + ([new] if new is not None else [])


def test_light_nodes_move_onto_the_fullest_node_emptiest_first():
    plan, _ = plan_of(four_nodes())
    assert plan.candidates == ("light-a", "light-b")
    assert [(m.pod, m.source, m.target) for m in plan.moves] == [
        ("ml/light-a-w0", "light-a", "heavy-b"),
        ("ml/light-b-w0", "light-b", "heavy-b"),
    ]
    assert plan.skips == ()
    assert plan.fenced == {"light-a", "light-b"}
    assert "1/4 GPUs in use (25% <= 40%)" in plan.moves[0].reason


def test_threshold_decides_the_candidates():
    objects = four_nodes(utilizationThresholdPercent=75)
    plan, _ = plan_of(objects)
    assert plan.candidates == ("light-a", "light-b", "heavy-a")
    # heavy-a's workers need a node at least as full that is no candidate: only heavy-b, and it has room
    assert {m.source for m in plan.moves} == {"light-a", "light-b", "heavy-a"}
    assert {m.target for m in plan.moves} == {"heavy-b"}
    plan, _ = plan_of(four_nodes(utilizationThresholdPercent=24))
    assert plan.candidates == () and plan.moves == ()


def test_planning_leaves_the_state_as_it_was():
    objects = four_nodes()
    state = ClusterState()
    load_cluster(state, objects)
    before = (state.gpu_usage(), sorted(a.uid for a in state.allocations()))
    plan_pool(state, "p", parse_config(objects[0]), snapshot_of(objects), NOW)
    assert (state.gpu_usage(), sorted(a.uid for a in state.allocations())) == before


def test_never_onto_another_candidate_even_when_the_scheduler_would_prefer_it():
    # light-b's one GPU is nearly full, so its mean load (21%) beats heavy-b's (10%): the placement mode
    # alone would send light-a's worker there. The plan only uses nodes that are no candidates.
    objects = four_nodes()
    objects = replace_obj(objects, "Pod", "light-b-w0", worker("light-b-w0", "light-b", 0, tflops="90",
                                                                  vram="36Gi"))
    plan, _ = plan_of(objects)
    assert [m.target for m in plan.moves] == ["heavy-b", "heavy-b"]


def test_never_onto_an_emptier_node_so_no_room_means_skip():
    # heavy nodes are full to the last byte; an idle node has all the room but is emptier than light-a
    objects: list[dict[str, Any]] = [pool()]
    for name in ("heavy", "light", "idle"):
        objects += [node(name), *gpus(name)]
    for i in range(4):
        objects += [worker(f"heavy-w{i}", "heavy", i, tflops="100", vram="40Gi"), pdb(f"heavy-w{i}")]
    objects += [worker("light-w0", "light", 0), pdb("light-w0")]
    plan, _ = plan_of(objects)
    assert plan.moves == ()
    assert [(s.node, s.reason) for s in plan.skips] == [("light", SkipReason.NO_ROOM)]
    assert "ml/light-w0 fits on no node of the pool that is at least as full" in plan.skips[0].message
    assert "idle" in plan.fenced


def test_a_node_whose_workers_do_not_all_fit_keeps_all_of_them():
    # heavy has room for one 30 GiB worker; light has two
    objects: list[dict[str, Any]] = [pool(), node("heavy"), *gpus("heavy"), node("light"), *gpus("light", 8)]
    for i in range(3):
        objects += [worker(f"heavy-w{i}", "heavy", i, tflops="100", vram="40Gi"), pdb(f"heavy-w{i}")]
    objects += [worker("light-w0", "light", 0, vram="30Gi"), worker("light-w1", "light", 1, vram="30Gi"),
                pdb("light-w0"), pdb("light-w1")]
    plan, _ = plan_of(objects)
    assert plan.moves == ()
    assert [s.reason for s in plan.skips] == [SkipReason.NO_ROOM]


def test_later_candidates_see_the_room_earlier_moves_took():
    # heavy has room for exactly one more worker: light-a (first by name) gets it, light-b is left
    plan, _ = plan_of(room_for_one())
    assert [(m.pod, m.target) for m in plan.moves] == [("ml/light-a-w0", "heavy")]
    assert [(s.node, s.reason) for s in plan.skips] == [("light-b", SkipReason.NO_ROOM)]


def native_pod(name: str, node_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "other"},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


def gang_member(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"].setdefault("annotations", {}).update({
        TF + "gang-group-key": "ml/trainer", TF + "gang-required-members": "2",
        TF + "gang-desired-members": "2"})
    return pod


SKIP_CASES = [
    ("cordoned", lambda o: replace_obj(o, "Node", "light-a", node("light-a", unschedulable=True)),
     SkipReason.CORDONED, "node light-a is cordoned"),
    ("do-not-disrupt", lambda o: replace_obj(o, "Node", "light-a", node(
        "light-a", labels={TF + "do-not-disrupt": "true"})),
     SkipReason.DO_NOT_DISRUPT, "node light-a is labelled tensor-fusion.ai/do-not-disrupt=true"),
    ("native-gpu-pod", lambda o: [*o, native_pod("cuda-job", "light-a")],
     SkipReason.NATIVE_GPU_POD,
     "pod other/cuda-job on node light-a uses nvidia.com/gpu outside tensor-fusion"),
    ("missing-pdb", lambda o: replace_obj(o, "PodDisruptionBudget", "light-a-w0-pdb", None),
     SkipReason.MISSING_PDB, "no PodDisruptionBudget covers pod ml/light-a-w0 on node light-a"),
    ("pdb-in-another-namespace", lambda o: replace_obj(o, "PodDisruptionBudget", "light-a-w0-pdb",
                                                       pdb("light-a-w0", namespace="elsewhere")),
     SkipReason.MISSING_PDB, "no PodDisruptionBudget covers pod ml/light-a-w0 on node light-a"),
    ("no-controller", lambda o: replace_obj(o, "Pod", "light-a-w0", worker("light-a-w0", "light-a", 0,
                                                                            owner=False)),
     SkipReason.NO_CONTROLLER, "pod ml/light-a-w0 has no controller to recreate it after eviction"),
    ("gang-member", lambda o: replace_obj(o, "Pod", "light-a-w0",
                                          gang_member(worker("light-a-w0", "light-a", 0))),
     SkipReason.GANG_MEMBER,
     "pod ml/light-a-w0 is a member of gang ml/trainer, which moves whole or not at all"),
    ("young-worker", lambda o: replace_obj(o, "Pod", "light-a-w0", worker(
        "light-a-w0", "light-a", 0, created="2026-06-01T11:00:00Z")),
     SkipReason.YOUNG_WORKER, "pod ml/light-a-w0 is younger than maxDuration 2h"),
]


@pytest.mark.parametrize(("change", "reason", "message"), [c[1:] for c in SKIP_CASES],
                         ids=[c[0] for c in SKIP_CASES])
def test_a_node_is_left_alone_with_its_reason(change, reason, message):
    plan, _ = plan_of(change(four_nodes()))
    assert [(s.node, s.reason, s.message) for s in plan.skips] == [("light-a", reason, message)]
    # the other light node is still emptied, and never onto the skipped one
    assert [(m.pod, m.source, m.target) for m in plan.moves] == [("ml/light-b-w0", "light-b", "heavy-b")]
    assert "light-a" in plan.fenced


def test_a_worker_that_is_terminating_needs_no_move():
    objects = four_nodes()
    leaving = worker("light-a-w0", "light-a", 0)
    leaving["metadata"]["deletionTimestamp"] = "2026-06-01T11:59:59Z"
    plan, _ = plan_of(replace_obj(objects, "Pod", "light-a-w0", leaving))
    assert [m.pod for m in plan.moves] == ["ml/light-b-w0"]
    assert plan.skips == ()


def test_max_duration_sets_the_age_a_worker_needs():
    objects = replace_obj(four_nodes(maxDuration="30m"), "Pod", "light-a-w0",
                          worker("light-a-w0", "light-a", 0, created="2026-06-01T11:00:00Z"))
    plan, _ = plan_of(objects)  # one hour old, maxDuration 30 minutes: it may move
    assert [m.pod for m in plan.moves] == ["ml/light-a-w0", "ml/light-b-w0"]


def test_nodes_of_other_pools_are_neither_candidates_nor_targets():
    objects = four_nodes()
    objects += [node("other-heavy"), *gpus("other-heavy", pool_name="q")]
    objects += [worker(f"oh-w{i}", "other-heavy", i, pool_name="q") for i in range(4)]
    plan, _ = plan_of(objects)
    assert {m.target for m in plan.moves} == {"heavy-b"}
    assert "other-heavy" not in plan.fenced


@pytest.mark.parametrize(("selector", "labels", "expected"), [
    (None, {"app": "a"}, False),
    ({}, {"app": "a"}, True),
    ({"matchLabels": {"app": "a"}}, {"app": "a", "x": "y"}, True),
    ({"matchLabels": {"app": "a"}}, {"app": "b"}, False),
    ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]}, {"app": "b"}, True),
    ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]}, {"app": "a"}, False),
    ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]}, {}, True),
    ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {}, True),
    ({"matchExpressions": [{"key": "app", "operator": "Bogus"}]}, {"app": "a"}, False),
])
def test_pdb_selector(selector, labels, expected):
    assert selects(selector, labels) is expected


def test_candidates_are_used_nodes_at_or_below_the_threshold():
    objects = four_nodes()
    objects += [node("empty"), *gpus("empty")]
    state = ClusterState()
    load_cluster(state, objects)
    uses = pool_nodes(state, "p")
    assert {n: (u.used_gpus, u.gpus) for n, u in uses.items()} == {
        "heavy-a": (3, 4), "heavy-b": (4, 4), "light-a": (1, 4), "light-b": (1, 4), "empty": (0, 4)}
    assert candidate_nodes(uses, 25) == ["light-a", "light-b"]
    assert candidate_nodes(uses, 75) == ["light-a", "light-b", "heavy-a"]
    assert candidate_nodes(uses, 0) == []


def test_offline_actions_are_the_plan_lines():
    objects = four_nodes()
    objects = replace_obj(objects, "Node", "light-b", node("light-b", unschedulable=True))
    objects += [pool("off", enabled=False), pool("broken", timezone="Mars/Olympus")]
    lines = [a.as_json() for a in plan(snapshot_inputs(objects, now=NOW), [plan_defrag])]
    assert lines == [
        {"action": "skip", "pool": "broken",
         "reason": "spec.nodeManagerConfig.nodeCompaction.defrag.timezone 'Mars/Olympus' is not a known IANA "
                   "time zone"},
        {"action": "evict", "pool": "p", "pod": "ml/light-a-w0", "from": "light-a", "to": "heavy-b",
         "reason": "node light-a has 1/4 GPUs in use (25% <= 40%)"},
        {"action": "skip", "pool": "p", "node": "light-b", "reason": "node light-b is cordoned"},
    ]


def test_plan_command_prints_defrag_lines_only_when_asked(tmp_path, capsys):
    from extender.cli import main

    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(yaml.safe_dump_all(four_nodes()))
    assert main(["plan", "--cluster", str(snapshot), "--now", NOW_TEXT, "--defrag"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["action"], x.get("pod"), x.get("to")) for x in lines if x["action"] in ("evict", "skip")] == [
        ("evict", "ml/light-a-w0", "heavy-b"), ("evict", "ml/light-b-w0", "heavy-b")]
    assert main(["plan", "--cluster", str(snapshot), "--now", NOW_TEXT]) == 0
    assert "evict" not in capsys.readouterr().out


def test_a_worker_pinned_to_its_node_cannot_move():
    objects = four_nodes()
    pinned = worker("light-a-w0", "light-a", 0)
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "light-a"}
    plan, _ = plan_of(replace_obj(objects, "Pod", "light-a-w0", pinned))
    assert [(s.node, s.reason) for s in plan.skips] == [("light-a", SkipReason.NO_ROOM)]
    assert [m.pod for m in plan.moves] == ["ml/light-b-w0"]


TAINT = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}


def required(*terms: dict) -> dict:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


@pytest.mark.parametrize(("pod_spec", "node_labels", "taints", "expected"), [
    ({}, {"zone": "a"}, [], True),
    ({"nodeSelector": {"zone": "a"}}, {"zone": "a"}, [], True),
    ({"nodeSelector": {"zone": "a"}}, {"zone": "b"}, [], False),
    (required({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
              {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}),
     {"zone": "a"}, [], True),
    (required({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]}]}),
     {"gen": "2"}, [], False),
    (required({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}), {}, [], True),
    ({}, {}, [TAINT], False),
    ({"tolerations": [{"key": "gpu", "operator": "Exists"}]}, {}, [TAINT], True),
    ({"tolerations": [{"key": "gpu", "operator": "Equal", "value": "h100"}]}, {}, [TAINT], False),
    ({"tolerations": [{"operator": "Exists"}]}, {}, [TAINT], True),
    ({}, {}, [{"key": "gpu", "effect": "PreferNoSchedule"}], True),
])
def test_node_admits(pod_spec, node_labels, taints, expected):
    from extender.controllers.defrag.plan import node_admits

    node_obj = {"metadata": {"name": "n", "labels": node_labels}, "spec": {"taints": taints}}
    assert node_admits({"spec": pod_spec}, node_obj) is expected
