"""ClusterState: filter, prioritize, reserve/release and the ledger as the scheduler and users see them."""

from __future__ import annotations

from typing import Any

import pytest

from extender.scheduling.state import ClusterState, InventorySource, Kind, PlacementError
from tests.unit.fixtures.scheduling import GIB, POOL, bound, gpu, make, pod


def pool(name: str, template: str | None = None, default: bool = False) -> dict[str, Any]:
    annotations = {"tensor-fusion.ai/is-default-pool": "true"} if default else {}
    spec = {"schedulingConfigTemplate": template} if template else {}
    return {"kind": "GPUPool", "metadata": {"name": name, "annotations": annotations}, "spec": spec}


def template(name: str, mode: str) -> dict[str, Any]:
    return {
        "kind": "SchedulingConfigTemplate",
        "metadata": {"name": name},
        "spec": {"placement": {"mode": mode}},
    }


def used(state: ClusterState, gpu_name: str) -> tuple[float, int]:
    tflops, vram = state.gpu_usage()[gpu_name]
    return float(tflops), vram


# Three nodes of two 100 TFLOPS / 40Gi GPUs: n1 mean load 14.5 (29 and 0), n2 10 (10 and 10), n3 0.
MODE_CLUSTER = (
    gpu("n1-a", "n1"),
    gpu("n1-b", "n1"),
    gpu("n2-a", "n2"),
    gpu("n2-b", "n2"),
    gpu("n3-a", "n3"),
    gpu("n3-b", "n3"),
    bound("x1", "n1", "n1-a", "50", "8Gi"),
    bound("x2", "n2", "n2-a"),
    bound("x3", "n2", "n2-b"),
)


@pytest.mark.parametrize(
    ("mode", "scores", "first_gpu"),
    [
        ("CompactFirst", {"n1": 10, "n2": 9, "n3": 8}, "n1-a"),
        ("NodeCompactGPULowLoad", {"n1": 10, "n2": 9, "n3": 8}, "n1-b"),
        ("LowLoadFirst", {"n3": 10, "n2": 9, "n1": 8}, "n3-a"),
    ],
)
def test_each_mode_ranks_nodes_and_picks_gpus(mode: str, scores: dict[str, int], first_gpu: str) -> None:
    state = make(*MODE_CLUSTER, pool(POOL, "t"), template("t", mode))
    new = pod("new")
    assert dict(state.prioritize(new, ["n1", "n2", "n3"])) == scores
    best = max(scores, key=lambda n: scores[n])
    assert state.reserve(new, best).gpu_ids == (first_gpu,)


def test_pool_without_template_uses_node_compact_gpu_low_load_and_override_wins() -> None:
    assert make(*MODE_CLUSTER).mode_for(POOL) == "NodeCompactGPULowLoad"
    state = make(*MODE_CLUSTER, mode_override="LowLoadFirst")
    assert state.rank(pod("new"), ["n1", "n2", "n3"]) == ["n3", "n2", "n1"]


def test_prioritize_gives_the_first_choice_by_name_ten_and_non_fitting_zero() -> None:
    state = make(
        gpu("a", "a"),
        gpu("b", "b"),
        gpu("c", "c"),
        gpu("full", "full"),
        bound("f", "full", "full", "100", "40Gi"),
    )
    # a, b and c are equally empty: "a" wins the tie by name alone, the others share the next score
    assert state.prioritize(pod("new"), ["c", "full", "a", "ghost", "b"]) == [
        ("c", 9),
        ("full", 0),
        ("a", 10),
        ("ghost", 0),
        ("b", 9),
    ]
    assert state.rank(pod("new"), ["c", "full", "a", "b"]) == ["a", "b", "c"]


def test_prioritize_keeps_a_unique_ten_when_the_first_choice_is_tied_and_keeps_the_order() -> None:
    # NodeCompactGPULowLoad: fullest node first. c and d are equally full, a and b empty.
    state = make(
        gpu("a", "a"), gpu("b", "b"), gpu("c", "c"), gpu("d", "d"),
        bound("on-c", "c", "c", "50", "20Gi"), bound("on-d", "d", "d", "50", "20Gi"),
    )
    assert dict(state.prioritize(pod("new"), ["d", "b", "c", "a"])) == {"c": 10, "d": 9, "a": 8, "b": 8}


def test_filter_sorts_nodes_into_fits_failed_and_unresolvable() -> None:
    state = make(
        gpu("ok", "ok"),
        gpu("busy", "busy"),
        gpu("h100", "h100", model="H100"),
        bound("hog", "busy", "busy", "95"),
    )
    outcome = state.filter(pod("new", "20"), ["ok", "busy", "ghost"])
    assert outcome.fits == ["ok"]
    assert outcome.failed == {
        "busy": "need 1 GPU with 20 TFLOPS and 4Gi VRAM free in pool p; 0 fit, "
        "best other GPU has 5 TFLOPS and 36Gi free"
    }
    assert outcome.unresolvable == {"ghost": "node has no GPUs known to the extender"}
    assert (outcome.error, outcome.capacity_only) == (None, False)
    model = state.filter(pod("m", annotations={"tensor-fusion.ai/gpu-model": "H100"}), ["ok", "h100"])
    assert model.fits == ["h100"]
    assert model.unresolvable == {"ok": "no GPU of model H100 in pool p on this node"}


@pytest.mark.parametrize(
    ("nodes", "capacity_only"),
    [
        (["busy"], True),
        (["busy", "ghost"], True),
        (["ghost"], False),
        (["ok", "busy"], False),
    ],
)
def test_capacity_only_when_nothing_fits_but_an_emptied_node_would(
    nodes: list[str], capacity_only: bool
) -> None:
    state = make(gpu("ok", "ok"), gpu("busy", "busy"), bound("hog", "busy", "busy", "95"))
    assert state.filter(pod("new", "20"), nodes).capacity_only is capacity_only


@pytest.mark.parametrize(
    "annotations",
    [
        {"tensor-fusion.ai/tflops-request": "ten"},
        {"tensor-fusion.ai/gpu-count": "0"},
        {"tensor-fusion.ai/compute-percent-request": "50"},
    ],
)
def test_unparseable_request_is_an_error_not_a_crash(annotations: dict[str, str]) -> None:
    state = make(gpu("a", "a"))
    outcome = state.filter(pod("bad", annotations=annotations), ["a"])
    assert outcome.error and "tensor-fusion.ai/" in outcome.error
    assert outcome.fits == [] and state.prioritize(pod("bad", annotations=annotations), ["a"]) == [("a", 0)]
    with pytest.raises(PlacementError):
        state.reserve(pod("bad", annotations=annotations), "a")


def test_filter_has_no_side_effects_and_reserve_takes_capacity() -> None:
    state = make(gpu("g", "n"))
    for _ in range(3):
        assert state.filter(pod("a", "60"), ["n"]).fits == ["n"]
    state.reserve(pod("a", "60"), "n")
    assert state.filter(pod("b", "60"), ["n"]).fits == []
    with pytest.raises(PlacementError, match="node n: need 1 GPU with 60 TFLOPS"):
        state.reserve(pod("b", "60"), "n")


def test_a_pod_whose_bind_is_under_way_is_offered_only_that_node() -> None:
    state = make(gpu("g1", "n1"), gpu("g2", "n2"))
    reservation = state.reserve(pod("a", "60"), "n1")
    outcome = state.filter(pod("a", "60"), ["n1", "n2"])
    assert outcome.fits == ["n1"]
    assert outcome.failed == {"n2": "the pod's bind to node n1 is in progress"}
    assert state.prioritize(pod("a", "60"), ["n2", "n1"]) == [("n2", 0), ("n1", 10)]
    state.release(reservation)
    assert state.filter(pod("a", "60"), ["n1", "n2"]).fits == ["n1", "n2"]


def test_release_frees_the_reservation_and_is_idempotent() -> None:
    state = make(gpu("g", "n"))
    reservation = state.reserve(pod("a", "60"), "n")
    state.release(reservation)
    state.release(reservation)
    assert used(state, "g") == (0, 0)
    assert state.filter(pod("b", "60"), ["n"]).fits == ["n"]


def test_bound_pod_replaces_its_reservation() -> None:
    state = make(gpu("g", "n"))
    reservation = state.reserve(pod("a", "60"), "n")
    state.apply(Kind.POD, "MODIFIED", bound("a", "n", "g", "60", rv="2"))
    assert used(state, "g") == (60, 4 * GIB)
    state.release(reservation)  # a stale release after success changes nothing
    assert used(state, "g") == (60, 4 * GIB)


@pytest.mark.parametrize(
    ("event", "change", "expected"),
    [
        ("MODIFIED", {"terminating": True}, (10, 4 * GIB)),
        ("MODIFIED", {"phase": "Succeeded"}, (0, 0)),
        ("MODIFIED", {"phase": "Failed"}, (0, 0)),
        ("DELETED", {}, (0, 0)),
    ],
)
def test_finished_pods_free_their_share_and_terminating_pods_keep_it(
    event: str, change: dict[str, Any], expected: tuple[int, int]
) -> None:
    state = make(gpu("g", "n"), bound("a", "n", "g"))
    state.apply(Kind.POD, event, bound("a", "n", "g", rv="2", **change))
    assert used(state, "g") == expected


def test_pod_with_gpu_ids_but_no_node_is_not_counted() -> None:
    state = make(gpu("g", "n"), pod("a", gpu_ids="g"))
    assert used(state, "g") == (0, 0)


def test_multi_gpu_pod_takes_its_request_on_each_of_count_gpus() -> None:
    state = make(gpu("g0", "n", index=0), gpu("g1", "n", index=1), gpu("g2", "n", index=2))
    reservation = state.reserve(pod("a", "30", annotations={"tensor-fusion.ai/gpu-count": "2"}), "n")
    assert reservation.gpu_ids == ("g0", "g1")
    assert [used(state, g)[0] for g in ("g0", "g1", "g2")] == [30, 30, 0]
    three = pod("b", annotations={"tensor-fusion.ai/gpu-count": "4"})
    assert state.filter(three, ["n"]).unresolvable == {
        "n": "need 4 matching GPUs in pool p on one node; this node has 3"
    }


def test_gpu_indices_pin_the_devices() -> None:
    state = make(gpu("g0", "n", index=0), gpu("g1", "n", index=1))
    assert state.reserve(pod("a", annotations={"tensor-fusion.ai/gpu-indices": "1"}), "n").gpu_ids == ("g1",)


def test_shared_takes_a_whole_idle_gpu_and_blocks_fractional_pods() -> None:
    state = make(gpu("g0", "n"), gpu("g1", "n"), bound("small", "n", "g0", "1", "1Gi"))
    shared = pod("s", None, "0", annotations={"tensor-fusion.ai/isolation": "shared"})
    assert state.reserve(shared, "n").gpu_ids == ("g1",)
    assert used(state, "g1") == (100, 40 * GIB)
    assert state.filter(pod("t", "0", "0"), ["n"]).fits == ["n"]  # still room on g0
    second = pod("s2", None, "0", annotations={"tensor-fusion.ai/isolation": "shared"})
    assert state.filter(second, ["n"]).failed["n"].startswith("need 1 idle GPU in pool p; 0 idle")


def test_a_gpu_held_by_a_pod_of_no_size_is_not_idle_for_a_shared_pod() -> None:
    """A pod asking for nothing still holds its GPU: a shared pod (the GPU whole, alone) is refused there at
    the filter and at the bind alike, so a burst never lets the two meet (one by one never does)."""
    state = make(gpu("g0", "n"), bound("nothing", "n", "g0", "0", "0"))
    shared = pod("s", None, "0", annotations={"tensor-fusion.ai/isolation": "shared"})
    assert state.filter(shared, ["n"]).fits == []
    with pytest.raises(PlacementError, match="idle"):
        state.reserve(shared, "n")
    state.apply(Kind.POD, "DELETED", bound("nothing", "n", "g0", "0", "0"))
    assert state.filter(shared, ["n"]).fits == ["n"]


def test_percent_request_uses_each_gpus_capacity() -> None:
    state = make(gpu("big", "n", tflops="1000"))
    state.reserve(pod("a", None, annotations={"tensor-fusion.ai/compute-percent-request": "25"}), "n")
    assert used(state, "big") == (250, 4 * GIB)


@pytest.mark.parametrize(
    ("annotations", "fits"),
    [
        ({}, ["p-node", "amd-node"]),
        ({"tensor-fusion.ai/vendor": "NVIDIA"}, ["p-node"]),
        ({"tensor-fusion.ai/gpupool": "q"}, ["q-node"]),
        ({"tensor-fusion.ai/vendor": "AMD"}, ["amd-node"]),
    ],
)
def test_pool_and_vendor_select_nodes(annotations: dict[str, str], fits: list[str]) -> None:
    state = make(gpu("a", "p-node"), gpu("b", "q-node", pool="q"), gpu("c", "amd-node", vendor="AMD"))
    assert state.filter(pod("x", annotations=annotations), ["p-node", "q-node", "amd-node"]).fits == fits


def test_gpu_pod_cap_per_node() -> None:
    state = make(gpu("g", "n"), bound("a", "n", "g"), bound("b", "n", "g"), max_pods_per_node=2)
    assert state.filter(pod("c"), ["n"]).failed == {"n": "node already runs 2 GPU pods (limit 2)"}


def test_pods_before_gpu_objects_are_counted_once_the_gpu_appears() -> None:
    state = make(bound("a", "n", "g", "40"))
    assert state.filter(pod("b", "70"), ["n"]).unresolvable["n"] == "node has no GPUs known to the extender"
    state.apply(Kind.GPU, "ADDED", gpu("g", "n"))
    assert used(state, "g") == (40, 4 * GIB)
    assert state.filter(pod("b", "70"), ["n"]).fits == []


def node(
    name: str, count: int = 2, product: str = "NVIDIA-L4", pool_label: str | None = None
) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.count": str(count), "nvidia.com/gpu.product": product}
    if pool_label:
        labels["tensor-fusion.ai/gpupool"] = pool_label
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}}


@pytest.mark.parametrize(
    ("source", "gpus"),
    [
        (InventorySource.AUTO, {"gfd": ["gfd-gpu-0", "gfd-gpu-1"], "both": ["obj"]}),
        (InventorySource.GPU_OBJECTS, {"gfd": [], "both": ["obj"]}),
        (
            InventorySource.NODE_LABELS,
            {"gfd": ["gfd-gpu-0", "gfd-gpu-1"], "both": ["both-gpu-0", "both-gpu-1"]},
        ),
    ],
)
def test_inventory_sources(source: InventorySource, gpus: dict[str, list[str]]) -> None:
    state = make(pool(POOL, default=True), node("gfd"), node("both"), gpu("obj", "both"), inventory=source)
    assert {n: [g.name for g in state.node_gpus(n)] for n in ("gfd", "both")} == gpus


def test_gfd_gpus_take_the_default_pool_and_schedule() -> None:
    state = make(node("gfd", 1))
    assert state.node_gpus("gfd")[0].pool is None
    state.apply(Kind.POOL, "ADDED", pool(POOL, default=True))
    view = state.node_gpus("gfd")[0]
    assert (view.pool, view.model, float(view.capacity_tflops)) == (POOL, "L4", 121.0)
    no_pool_annotation = pod("a")
    del no_pool_annotation["metadata"]["annotations"]["tensor-fusion.ai/gpupool"]
    assert state.reserve(no_pool_annotation, "gfd").gpu_ids == ("gfd-gpu-0",)


def test_pending_index_holder() -> None:
    holder = pod("h", node="n", annotations={"tensor-fusion.ai/index": "3"})
    running = pod("r", node="n", phase="Running", annotations={"tensor-fusion.ai/index": "4"})
    by_resource = pod("q", node="n")
    by_resource["spec"]["containers"][0]["resources"] = {"limits": {"tensor-fusion.ai/index_0": "5"}}
    state = make(gpu("g", "n"), holder, running, by_resource)
    assert state.pending_index_holder("n", 3, "uid-other") == "ml/h"
    assert state.pending_index_holder("n", 3, "uid-h") is None
    assert state.pending_index_holder("n", 4, "uid-other") is None
    assert state.pending_index_holder("n", 5, "uid-other") == "ml/q"
    assert state.pending_index_holder("other", 3, "uid-other") is None


def test_a_reservation_holds_its_index_until_released() -> None:
    state = make(gpu("g", "n"))
    pending = pod("a", annotations={"tensor-fusion.ai/index": "7"})
    reservation = state.reserve(pending, "n")
    assert state.pending_index_holder("n", 7, "uid-b") == "ml/a"
    state.release(reservation)
    assert state.pending_index_holder("n", 7, "uid-b") is None


def test_a_retried_reservation_holds_its_index_on_its_new_node_only() -> None:
    state = make(gpu("g", "n"), gpu("h", "m"))
    pending = pod("a", annotations={"tensor-fusion.ai/index": "7"})
    state.reserve(pending, "n")
    moved = state.reserve(pending, "m")
    assert (state.pending_index_holder("n", 7, "uid-b"), state.pending_index_holder("m", 7, "uid-b")) == (
        None, "ml/a")
    state.release(moved)
    assert state.pending_index_holder("m", 7, "uid-b") is None


def test_utilisation_per_node_and_pool() -> None:
    state = make(
        gpu("g0", "n"),
        gpu("g1", "n"),
        gpu("g2", "m"),
        bound("a", "n", "g0", "50", "20Gi"),
        bound("b", "m", "g2", "100", "40Gi"),
    )
    usage = state.utilisation()
    assert (usage.nodes["n"].tflops_percent, usage.nodes["n"].vram_percent) == (25.0, 25.0)
    assert (usage.nodes["m"].tflops_percent, usage.pools[POOL].tflops_percent) == (100.0, 50.0)
    assert (usage.partially_used_gpus, usage.nodes["n"].used_gpus) == (1, 1)
    [g0, g1] = state.node_gpus("n")
    assert (g0.name, float(g0.used_tflops), g0.used_vram, g0.used_percent) == ("g0", 50.0, 20 * GIB, 50.0)
    assert g1.used_percent == 0.0


def test_cached_verdicts_follow_every_change() -> None:
    state = make(gpu("g", "n"))
    assert state.filter(pod("a", "60"), ["n"]).fits == ["n"]
    state.apply(Kind.POD, "ADDED", bound("other", "n", "g", "50"))
    assert state.filter(pod("a", "60"), ["n"]).fits == []
    state.apply(Kind.POD, "DELETED", bound("other", "n", "g", "50"))
    assert state.filter(pod("a", "60"), ["n"]).fits == ["n"]
    state.apply(Kind.GPU, "MODIFIED", gpu("g", "n", phase="Pending"))
    assert state.filter(pod("a", "60"), ["n"]).unresolvable == {
        "n": "no Running GPU free for tensor-fusion in pool p on this node"
    }
    state.apply(Kind.GPU, "DELETED", gpu("g", "n"))
    assert state.filter(pod("a", "60"), ["n"]).unresolvable == {"n": "node has no GPUs known to the extender"}


def test_unknown_mode_override_is_rejected() -> None:
    with pytest.raises(ValueError, match="CompactFirst"):
        ClusterState(mode_override="Fastest")


# --- trust: what a bound pod holds is what its bind recorded ----------------------------------------------

def test_the_bind_time_record_counts_not_the_request_annotations() -> None:
    state = make(pool(POOL), gpu("g1", "n1"))
    reservation = state.reserve(pod("a", "80"), "n1")
    recorded = {"tensor-fusion.ai/allocated": "tflops=80,vram=4Gi"}
    state.apply(Kind.POD, "MODIFIED", bound("a", "n1", "g1", tflops="80", annotations=recorded, rv="2"))
    assert used(state, "g1")[0] == 80.0
    # the tenant patches the request down after the bind, then removes the record: 80 still count
    state.apply(Kind.POD, "MODIFIED", bound("a", "n1", "g1", tflops="0", annotations=recorded, rv="3"))
    state.apply(Kind.POD, "MODIFIED", pod("a", "0", node="n1", phase="Running", rv="4"))
    assert used(state, "g1")[0] == 80.0
    with pytest.raises(PlacementError):
        state.reserve(pod("b", "80"), "n1")
    assert reservation.gpu_ids == ("g1",)


def test_after_a_restart_records_count_within_capacity_only() -> None:
    found: list[tuple[str, str]] = []
    state = ClusterState(on_refused=lambda a, reason, _message: found.append((a.pod_key, reason.value)))
    for obj in (pool(POOL), gpu("g1", "n1"), gpu("g2", "n2")):
        state.apply({"GPU": Kind.GPU, "GPUPool": Kind.POOL}[obj["kind"]], "ADDED", obj)
    for name, node, gpus, record in (("a", "n1", "g1", "tflops=80,vram=4Gi"),
                                      ("forged", "n1", "g1", "tflops=80,vram=4Gi"),
                                      ("elsewhere", "n1", "g2", "tflops=1,vram=1Gi")):
        record_of = {"tensor-fusion.ai/allocated": record}
        state.apply(Kind.POD, "ADDED", bound(name, node, gpus, annotations=record_of))
    assert used(state, "g1")[0] == 80.0 and used(state, "g2")[0] == 0.0
    assert found == [("ml/forged", "over_capacity"), ("ml/elsewhere", "node_mismatch")]


def test_later_updates_of_a_bound_pod_with_the_same_record_are_not_findings() -> None:
    found: list[str] = []
    state = ClusterState(on_refused=lambda a, reason, _message: found.append(reason.value))
    for obj in (pool(POOL), gpu("g1", "n1")):
        state.apply({"GPU": Kind.GPU, "GPUPool": Kind.POOL}[obj["kind"]], "ADDED", obj)
    state.reserve(pod("a", "80"), "n1")
    recorded = {"tensor-fusion.ai/allocated": "tflops=80,vram=4Gi"}
    for rv in ("2", "3"):  # bound, then Running: the same record twice
        state.apply(Kind.POD, "MODIFIED", bound("a", "n1", "g1", tflops="80", annotations=recorded, rv=rv))
    assert found == [] and used(state, "g1")[0] == 80.0
    # a record changed after those updates is still noticed, once, and the count stands until deletion
    changed = {"tensor-fusion.ai/allocated": "tflops=1,vram=1Gi"}
    for rv in ("4", "5"):
        state.apply(Kind.POD, "MODIFIED", bound("a", "n1", "g1", tflops="80", annotations=changed, rv=rv))
    assert found == ["record_changed"] and used(state, "g1")[0] == 80.0
    state.apply(Kind.POD, "DELETED", bound("a", "n1", "g1", tflops="80", annotations=changed, rv="6"))
    assert used(state, "g1")[0] == 0.0


@pytest.mark.parametrize("mode", ["CompactFirst", "LowLoadFirst", "NodeCompactGPULowLoad"])
def test_first_choice_is_the_node_prioritize_scores_ten(mode: str) -> None:
    state = make(gpu("g1", "n1"), gpu("g2", "n2"), gpu("g3", "n3"), gpu("g4", "n4"), mode_override=mode)
    state.apply(Kind.POD, "ADDED", bound("busy", "n2", "g2", "30"))
    state.apply(Kind.POD, "ADDED", bound("busier", "n3", "g3", "50"))
    asked = pod("a", "10")
    outcome = state.filter(asked, ["n4", "n3", "n2", "n1"])
    narrowed = state.first_choice(asked, outcome, hold=False)
    top = [n for n, score in state.prioritize(asked, outcome.fits) if score == 10]
    assert narrowed.fits == top and len(top) == 1
    assert narrowed.fits == (["n1"] if mode == "LowLoadFirst" else ["n3"])  # n1, n4 tie: by name
    assert state.first_choice(asked, state.filter(asked, ["n2"]), hold=False).fits == ["n2"]


def test_the_first_choice_is_held_for_the_bind_and_lapses_unused() -> None:
    now = [0.0]
    state = make(gpu("g1", "n1"), clock=lambda: now[0], hold_seconds=10)
    first, second = pod("a", "60"), pod("b", "60")
    assert state.first_choice(first, state.filter(first, ["n1"])).fits == ["n1"]
    # the next pod, filtered before the first one's bind arrives, no longer sees that room
    assert state.filter(second, ["n1"]).fits == []
    assert state.filter(first, ["n1"]).fits == ["n1"]  # the first pod itself still does
    reservation = state.reserve(first, "n1")  # the bind takes the hold over
    assert reservation.gpu_ids == ("g1",) and used(state, "g1") == (60, 4 * GIB)
    state.release(reservation)
    assert state.filter(second, ["n1"]).fits == ["n1"]
    state.first_choice(second, state.filter(second, ["n1"]))
    assert state.filter(first, ["n1"]).fits == []
    now[0] = 10.5  # no bind came: the hold lapses
    assert state.filter(first, ["n1"]).fits == ["n1"]
    assert used(state, "g1") == (0, 0)
