"""The quota rule over a real cluster state: the filter's answers, the bind's exact check, requests counted
on the GPUs they land on, a restart rebuilding usage from the pods, and preemption net of its victims."""

from __future__ import annotations

import asyncio
from typing import Any

from extender.controllers.quota.rule import EVENT_REASON, QuotaRule
from extender.quota.book import QuotaBook
from extender.scheduling.state import ClusterState, Kind
from tests.unit.fixtures.scheduling import bound, gpu, make, pod

NODES = ["n1", "n2"]


class Quotas:
    def __init__(self, *objects: dict[str, Any], synced: bool = True) -> None:
        self.objects = list(objects)
        self.synced = asyncio.Event()
        if synced:
            self.synced.set()

    def list(self) -> list[dict[str, Any]]:
        return self.objects


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self.recorded.append((obj["metadata"]["name"], reason, message))


def quota(spec: dict[str, Any], namespace: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": "q", "namespace": namespace}, "spec": spec}


def total(tflops: str = "100", vram: str = "1Ti", namespace: str = "ml") -> dict[str, Any]:
    return quota({"total": {"requests": {"tflops": tflops, "vram": vram}}}, namespace)


def rule_on(state: ClusterState, *quotas: dict[str, Any], synced: bool = True) -> tuple[QuotaRule, Events]:
    events = Events()
    cache = Quotas(*quotas, synced=synced)
    rule = QuotaRule(QuotaBook(state, cache.list), cache, events, node_gpus=state.node_gpus)
    state.quota_gate = rule
    return rule, events


def cluster(*pods: dict[str, Any]) -> ClusterState:
    return make(gpu("g1", "n1"), gpu("g2", "n1", index=1), gpu("g3", "n2"), gpu("g4", "n2", index=1), *pods)


def bind(rule: QuotaRule, state: ClusterState, p: dict[str, Any], node: str) -> str | None:
    """The binder's synchronous part: admit, reserve, admit_reserved (release on refusal)."""
    if reason := rule.admit(p, node):
        return reason
    reservation = state.reserve(p, node)
    if reason := rule.admit_reserved(p, node, reservation.gpu_ids):
        state.release(reservation)
        return reason
    return None


def test_a_total_breached_fails_every_node_resolvably_and_says_why():
    state = cluster(bound("a", "n1", "g1", tflops="95"))
    rule, events = rule_on(state, total("100"))
    outcome = rule.before_filter(pod("b", "10"), NODES)
    assert outcome is not None and not outcome.fits and not outcome.unresolvable
    assert set(outcome.failed) == set(NODES) and outcome.capacity_only is False
    message = outcome.failed["n1"]
    assert "namespace ml" in message and "total.max.tflops.request" in message
    assert "used 95 TFLOPS, requested 10 TFLOPS, cap 100 TFLOPS" in message
    assert events.recorded == [("b", EVENT_REASON, message)]
    rule.before_filter(pod("b", "10"), NODES)
    assert len(events.recorded) == 1  # not once per retry
    assert rule.before_filter(pod("c", "5"), NODES) is None  # 95 + 5 fits exactly


def test_a_single_cap_breached_is_unresolvable():
    state = cluster()
    rule, _ = rule_on(state, quota({"single": {"maxGPUCount": 1}}))
    outcome = rule.before_filter(pod("b", annotations={"tensor-fusion.ai/gpu-count": "2"}), NODES)
    assert outcome is not None and set(outcome.unresolvable) == set(NODES) and not outcome.failed


def test_other_namespaces_are_not_held():
    state = cluster(bound("a", "n1", "g1", tflops="100"))
    rule, _ = rule_on(state, total("100", namespace="elsewhere"))
    assert rule.before_filter(pod("b"), NODES) is None


def test_until_quotas_are_read_the_verbs_answer_an_error():
    state = cluster()
    rule, _ = rule_on(state, total(), synced=False)
    outcome = rule.before_filter(pod("b"), NODES)
    assert outcome is not None and outcome.error and "not synced" in outcome.error
    assert rule.admit(pod("b"), "n1")


def test_a_burst_of_binds_ends_exactly_at_the_total():
    """Every filter passed before any bind (the scheduler pipelines): the bind's check against the ledger
    admits exactly the total's worth."""
    state = cluster()
    rule, _ = rule_on(state, total("50"))
    pods = [pod(f"p{i}", "5", "1Gi") for i in range(30)]
    assert all(rule.before_filter(p, NODES) is None for p in pods)
    outcomes = [bind(rule, state, p, NODES[i % 2]) for i, p in enumerate(pods)]
    assert sum(o is None for o in outcomes) == 10
    assert rule.book.usage("ml").requests.tflops == 50
    refused = [o for o in outcomes if o is not None]
    assert all("total.max.tflops.request" in o for o in refused)


def test_a_failed_bind_releases_its_quota():
    state = cluster()
    rule, _ = rule_on(state, total("10"))
    first = pod("p1", "10")
    reservation = state.reserve(first, "n1")
    assert rule.admit(pod("p2", "10"), "n1")
    state.release(reservation)  # the Binding was refused
    assert rule.admit(pod("p3", "10"), "n1") is None


def test_deletion_releases_its_quota():
    held = bound("a", "n1", "g1", tflops="10")
    state = cluster(held)
    rule, _ = rule_on(state, total("10"))
    assert rule.admit(pod("b", "10"), "n1")
    state.apply(Kind.POD, "DELETED", held)
    assert rule.admit(pod("c", "10"), "n1") is None


def test_a_percent_request_counts_the_tflops_of_the_gpu_it_lands_on():
    state = make(gpu("big", "n1", tflops="300"), gpu("small", "n2", tflops="60"))
    rule, _ = rule_on(state, total("100"))
    half = {"tensor-fusion.ai/compute-percent-request": "50"}
    assert bind(rule, state, pod("on-big", None, annotations=half), "n1") is not None  # 150 > 100
    assert state.reservation("uid-on-big") is None  # released on refusal
    assert bind(rule, state, pod("on-small", None, annotations=half), "n2") is None  # 30
    assert rule.book.usage("ml").requests.tflops == 30


def test_a_restart_rebuilds_usage_from_the_pods():
    pods = [bound(f"p{i}", "n1" if i < 2 else "n2", f"g{i + 1}", tflops="20") for i in range(4)]
    state = cluster(*pods)  # a fresh state fed from the watch, as after a restart
    rule, _ = rule_on(state, total("100"))
    assert rule.book.usage("ml").requests.tflops == 80 and rule.book.usage("ml").workers == 4
    assert rule.admit(pod("too-big", "30"), "n1")
    assert rule.admit(pod("fits", "20"), "n1") is None


def test_preemption_inside_a_quota_frees_the_quota_net_of_the_victims():
    low = [bound(f"low{i}", "n1", f"g{i + 1}", tflops="50", priority=1) for i in range(2)]
    state = cluster(*low)
    rule, _ = rule_on(state, total("100"))
    high = pod("high", "50", priority=100)
    assert rule.before_filter(high, NODES) is not None  # the GPUs have room, the quota has none
    choice = state.find_preemption(high)
    assert choice is not None
    _node, victims = choice
    assert [v.name for v in victims] == ["low0"]  # one victim frees enough quota
    state.quota_gate = None  # without the quota no victim is needed at all
    assert state.find_preemption(high) is None or state.find_preemption(high)[1] == []  # type: ignore[index]


def test_preemption_takes_no_victim_of_another_namespace_for_a_quota():
    other = bound("theirs", "n1", "g1", tflops="50", priority=1)
    other["metadata"]["namespace"] = "other"
    state = cluster(other, bound("mine", "n2", "g3", tflops="100", priority=500))
    _rule, _ = rule_on(state, total("100"))
    assert state.find_preemption(pod("high", "50", priority=100)) is None


def test_a_gang_is_admitted_whole_or_not_at_all():
    state = cluster(bound("a", "n1", "g1", tflops="40"))
    rule, _ = rule_on(state, total("100"))
    gang = [pod(f"m{i}", "20") for i in range(3)]
    members = [(p, state.request_of(p)) for p in gang]
    assert rule.refusal_together(members) is None  # 40 + 60
    bigger = [*members, (pod("m3", "20"), state.request_of(pod("m3", "20")))]
    refusal = rule.refusal_together(bigger)
    assert refusal is not None and refusal.requested == "80 TFLOPS"
    reservation = state.reserve(gang[0], "n1")  # a member already reserved is not counted twice
    assert rule.refusal_together(members) is None
    state.release(reservation)


def test_a_percent_request_is_refused_at_filter_when_even_the_smallest_gpu_breaches():
    state = make(gpu("big", "n1", tflops="300"), gpu("small", "n2", tflops="60"),
                 bound("a", "n2", "small", tflops="10"))
    rule, _ = rule_on(state, total("100"))
    quarter = {"tensor-fusion.ai/compute-percent-request": "25"}
    assert rule.before_filter(pod("p25", None, annotations=quarter), NODES) is None  # 15 on the small one
    most = {"tensor-fusion.ai/compute-percent-request": "100"}
    outcome = rule.before_filter(pod("p100", None, annotations=most), NODES)  # at least 60: 10 + 60 fits
    assert outcome is None
    outcome = rule.before_filter(pod("p2", None, annotations={**most, "tensor-fusion.ai/gpu-count": "2"}),
                                 NODES)  # at least 2 x 60 = 120 > 90 left
    assert outcome is not None and "requested 120 TFLOPS" in outcome.failed["n1"]
