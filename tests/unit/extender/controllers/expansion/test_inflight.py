"""Claims in flight: which pods a node on its way can take, and when a claim stops counting."""

from __future__ import annotations

from typing import Any

import pytest

from extender.common.contract import GPURequest, parse_request
from extender.common.labels import INSTANCE_TYPE, ZONE
from extender.controllers.expansion.fit import device_of, empty_copy_fits
from extender.controllers.expansion.inflight import InFlight, LeaveReason
from extender.scheduling.inventory import NANO, GPUDevice
from extender.scheduling.state import GPUView

Gi = 1 << 30


def gpu(name: str, pool: str = "pool-a", model: str = "A100", tflops: int = 100, vram: int = 40,
        index: int = 0) -> GPUDevice:
    return GPUDevice(name=name, node="template", pool=pool, model=model, vendor="NVIDIA", index=index,
                     phase="Running", used_by="tensor-fusion", isolation_mode="soft",
                     capacity_tflops=tflops * NANO, capacity_vram=vram * Gi)


TWO_A100 = [gpu("g0"), gpu("g1", index=1)]


def request(**kw: str | None) -> GPURequest:
    """A pod's request; a keyword set to None drops that annotation."""
    annotations: dict[str, str | None] = {"tensor-fusion.ai/gpupool": "pool-a",
                                          "tensor-fusion.ai/tflops-request": "10",
                                          "tensor-fusion.ai/vram-request": "4Gi"}
    annotations.update({f"tensor-fusion.ai/{k.replace('_', '-')}": v for k, v in kw.items()})
    return parse_request({k: v for k, v in annotations.items() if v is not None})


def pod(uid: str, node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": f"pod-{uid}", "namespace": "ns", "uid": uid},
            "spec": {"nodeSelector": node_selector or {}}}


def claim_body(zone: str = "z-a") -> dict[str, Any]:
    return {"metadata": {"name": "c1", "labels": {}}, "spec": {"requirements": [
        {"key": ZONE, "operator": "In", "values": [zone]},
        {"key": INSTANCE_TYPE, "operator": "In", "values": ["p4d"]}]}}


@pytest.mark.parametrize(("case", "req", "fits"), [
    ("small share", request(), True),
    ("whole GPU", request(isolation="shared", tflops_request=None, vram_request=None), True),
    ("two GPUs", request(gpu_count="2"), True),
    ("three GPUs on a two-GPU node", request(gpu_count="3"), False),
    ("more VRAM than one GPU has", request(vram_request="41Gi"), False),
    ("more TFLOPS than one GPU has", request(tflops_request="101"), False),
    ("percent of a GPU", request(tflops_request=None, compute_percent_request="50"), True),
    ("another pool", request(gpupool="pool-b"), False),
    ("another model", request(gpu_model="H100"), False),
])
def test_empty_copy_fit(case: str, req: GPURequest, fits: bool) -> None:
    assert empty_copy_fits(TWO_A100, req) is fits, case


def test_state_views_become_devices() -> None:
    from fractions import Fraction

    record = GPUDevice(name="g", node="n", pool="pool-a", model="A100", vendor="NVIDIA", index=0,
                       phase="Pending", used_by="someone-else", isolation_mode="hard",
                       capacity_tflops=312 * NANO, capacity_vram=80 * Gi)
    view = GPUView(name="g", node="n", pool="pool-a", model="A100", vendor="NVIDIA", index=0, phase="Pending",
                   capacity_tflops=Fraction(312), capacity_vram=80 * Gi, used_tflops=Fraction(300),
                   used_vram=80 * Gi, used_percent=99.0, device=record)
    device = device_of(view)
    assert device.capacity_tflops == 312 * NANO and device.capacity_vram == 80 * Gi
    assert (device.phase, device.used_by) == ("Running", "")  # a new node's GPU is free for tensor-fusion
    assert empty_copy_fits([device], request(vram_request="80Gi"))  # empty copy: usage is not copied


def test_pods_fill_a_claim_until_it_has_no_room() -> None:
    inflight = InFlight(max_in_flight=15, timeout_seconds=600)
    inflight.add("c1", claim_body(), TWO_A100, now=0)
    big = request(vram_request="30Gi")
    placed = [inflight.fits_in_flight(pod(str(i)), big) for i in range(3)]
    assert placed == ["c1", "c1", "c1"]  # the query alone reserves nothing
    assert inflight.assign("c1", pod("1"), big) and inflight.assign("c1", pod("2"), big)
    assert inflight.fits_in_flight(pod("3"), big) is None
    assert not inflight.assign("c1", pod("3"), big)
    assert inflight.fits_in_flight(pod("3"), request(vram_request="10Gi")) == "c1"
    assert inflight.waiting_on("1") == "c1" and inflight.waiting_on("3") is None


def test_assigning_the_same_pod_twice_counts_once() -> None:
    inflight = InFlight(max_in_flight=15, timeout_seconds=600)
    inflight.add("c1", claim_body(), [gpu("g0")], now=0)
    req = request(vram_request="30Gi")
    assert inflight.assign("c1", pod("1"), req) and inflight.assign("c1", pod("1"), req)
    assert inflight.fits_in_flight(pod("2"), request(vram_request="10Gi")) == "c1"


def test_a_claim_in_another_zone_does_not_take_the_pod() -> None:
    inflight = InFlight(max_in_flight=15, timeout_seconds=600)
    inflight.add("c1", claim_body("z-a"), TWO_A100, now=0)
    assert inflight.fits_in_flight(pod("1", {ZONE: "z-b"}), request()) is None
    assert inflight.fits_in_flight(pod("1", {ZONE: "z-a"}), request()) == "c1"


def test_max_in_flight() -> None:
    inflight = InFlight(max_in_flight=2, timeout_seconds=600)
    inflight.add("c1", claim_body(), TWO_A100, now=0)
    assert not inflight.full
    inflight.add("c2", claim_body(), TWO_A100, now=0)
    assert inflight.full and len(inflight) == 2
    inflight.remove("c1", LeaveReason.GONE)
    assert not inflight.full


def claim_obj(node_name: str = "", provider_id: str = "", conditions: dict[str, str] | None = None,
              deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c1"}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"metadata": meta, "status": {
        "nodeName": node_name, "providerID": provider_id,
        "conditions": [{"type": t, "status": s} for t, s in (conditions or {}).items()]}}


@pytest.mark.parametrize(("case", "obj", "nodes", "now", "expected"), [
    ("launched, no node yet", claim_obj(provider_id="kwok://n1"), set(), 10, None),
    ("its node registered (by name)", claim_obj("n1"), {"n1"}, 10, LeaveReason.REGISTERED),
    ("its node registered (by providerID)", claim_obj(provider_id="kwok://n1"), {"kwok://n1"}, 10,
     LeaveReason.REGISTERED),
    ("nodeName set but the node's GPUs are not known yet", claim_obj("n1"), set(), 10, None),
    ("Ready", claim_obj(conditions={"Ready": "True"}), set(), 10, LeaveReason.READY),
    ("not Ready yet", claim_obj(conditions={"Ready": "False", "Launched": "True"}), set(), 10, None),
    ("being deleted", claim_obj(deleting=True), set(), 10, LeaveReason.GONE),
    ("past the timeout", claim_obj(provider_id="kwok://n1"), set(), 601, LeaveReason.TIMEOUT),
    ("not in the cache yet, shortly after creation", None, set(), 5, None),
    ("never showed up", None, set(), 61, LeaveReason.GONE),
])
def test_when_a_claim_leaves(case: str, obj: dict[str, Any] | None, nodes: set[str], now: float,
                             expected: LeaveReason | None) -> None:
    inflight = InFlight(max_in_flight=15, timeout_seconds=600, unseen_grace_seconds=60)
    inflight.add("c1", claim_body(), TWO_A100, now=0)
    inflight.assign("c1", pod("p1"), request())
    departures = inflight.settle(lambda name: obj, lambda name, pid: name in nodes or pid in nodes, now)
    if expected is None:
        assert departures == [] and "c1" in inflight, case
    else:
        left = [(d.claim, d.reason, [p.uid for p in d.pods]) for d in departures]
        assert left == [("c1", expected, ["p1"])], case
        assert "c1" not in inflight


def test_a_claim_seen_once_then_gone_leaves_at_once() -> None:
    inflight = InFlight(max_in_flight=15, timeout_seconds=600, unseen_grace_seconds=60)
    inflight.add("c1", claim_body(), TWO_A100, now=0)
    assert inflight.settle(lambda name: claim_obj(), lambda n, p: False, 1) == []
    assert [d.reason for d in inflight.settle(lambda name: None, lambda n, p: False, 2)] == [LeaveReason.GONE]
