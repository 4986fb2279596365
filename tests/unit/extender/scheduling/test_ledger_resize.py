"""Resize in place: the ledger moves a bound pod's share of its GPUs, clamps a scale-up to the room left,
refuses with the room when none is left, and never touches another pod."""

from __future__ import annotations

from fractions import Fraction

from extender.common.contract import Isolation
from extender.scheduling.inventory import NANO
from extender.scheduling.ledger import Distrust, Ledger, Resized, Usage
from tests.unit.fixtures.scheduling import GIB, alloc, ledger_with_gpus, request


def test_a_scale_up_that_fits_moves_only_that_pods_share() -> None:
    ledger = ledger_with_gpus("g1")
    ledger.bind(alloc("a"))
    ledger.bind(alloc("b"))
    out = ledger.resize("a", Fraction(30), None)
    assert out.outcome is Resized.RESIZED
    assert out.after is not None and out.after.request.tflops_request == 30
    assert out.after.request.vram_request == 4 * GIB  # VRAM did not move
    assert ledger.usage("g1") == Usage(40 * NANO, 8 * GIB, 0)
    assert out.touched == {"n1"}
    assert "10 -> 30 TFLOPS" in out.message


def test_a_scale_up_beyond_the_room_is_clamped_and_no_gpu_goes_over() -> None:
    ledger = ledger_with_gpus("g1")
    ledger.bind(alloc("a"))
    ledger.bind(alloc("b", req=request("70", 30 * GIB)))
    out = ledger.resize("a", Fraction(50), 20 * GIB)
    assert out.outcome is Resized.CLAMPED
    assert out.after is not None
    assert out.after.request.tflops_request == 30 and out.after.request.vram_request == 10 * GIB
    assert ledger.usage("g1") == Usage(100 * NANO, 40 * GIB, 0)
    assert "TFLOPS and VRAM clamped to the room left (30 TFLOPS and 10Gi VRAM per GPU for it)" in out.message


def test_a_full_gpu_refuses_with_the_room_left() -> None:
    ledger = ledger_with_gpus("g1")
    ledger.bind(alloc("a"))
    ledger.bind(alloc("b", req=request("90", 36 * GIB)))
    out = ledger.resize("a", Fraction(20), None)
    assert out.outcome is Resized.REFUSED
    assert out.after == out.before
    assert out.message == "its GPUs have no room for more (10 TFLOPS and 4Gi VRAM per GPU for it)"
    assert ledger.usage("g1") == Usage(100 * NANO, 40 * GIB, 0)


def test_a_multi_gpu_pod_is_clamped_to_its_fullest_gpu() -> None:
    ledger = ledger_with_gpus("g1", "g2")
    ledger.bind(alloc("a", gpus=("g1", "g2")))
    ledger.bind(alloc("b", gpus=("g2",), req=request("80")))
    out = ledger.resize("a", Fraction(60), None)
    assert out.outcome is Resized.CLAMPED and out.after is not None
    assert out.after.request.tflops_request == 20
    assert ledger.usage("g1").tflops == 20 * NANO and ledger.usage("g2").tflops == 100 * NANO


def test_a_scale_down_frees_room_another_pod_then_uses() -> None:
    ledger = ledger_with_gpus("g1")
    ledger.bind(alloc("a", req=request("60", 20 * GIB)))
    out = ledger.resize("a", Fraction(20), 8 * GIB)
    assert out.outcome is Resized.RESIZED
    assert ledger.usage("g1") == Usage(20 * NANO, 8 * GIB, 0)
    # a pod read after a restart claiming the freed room is believed now
    ledger.bind(alloc("c", req=request("80", 32 * GIB)))
    assert ledger.bound("c") is not None and ledger.usage("g1") == Usage(100 * NANO, 40 * GIB, 0)


def test_the_patched_record_and_a_stale_one_are_both_quiet() -> None:
    seen: list[Distrust] = []
    ledger = Ledger(on_refused=lambda a, reason, m: seen.append(reason))
    ledger.set_gpu("g1", "n1", 100 * NANO, 40 * GIB)
    ledger.bind(alloc("a"))
    out = ledger.resize("a", Fraction(20), None)
    assert out.after is not None
    ledger.bind(alloc("a"))  # the watch still shows the record from before the resize
    ledger.bind(out.after)  # then the patched one
    assert seen == []
    assert ledger.usage("g1").tflops == 20 * NANO


def test_a_restarted_ledger_reads_the_same_figures_back() -> None:
    ledger = ledger_with_gpus("g1")
    ledger.bind(alloc("a"))
    ledger.bind(alloc("b"))
    out = ledger.resize("a", Fraction(35), 6 * GIB)
    assert out.after is not None
    fresh = ledger_with_gpus("g1")
    for allocation in (out.after, alloc("b")):  # what the pods' records say after the patch
        fresh.bind(allocation)
    assert fresh.usage("g1") == ledger.usage("g1")


def test_unbound_whole_and_percent_pods_are_refused() -> None:
    ledger = ledger_with_gpus("g1")
    assert ledger.resize("nobody", Fraction(5), None).message == "the pod holds no counted GPU allocation"
    ledger.bind(alloc("w", req=request(None, 0, isolation=Isolation.SHARED)))
    assert ledger.resize("w", Fraction(5), None).outcome is Resized.REFUSED
    ledger.forget("w")
    ledger.bind(alloc("p", req=request(None, GIB, percent="20")))
    assert "by percent" in ledger.resize("p", Fraction(5), None).message


def test_nothing_to_change_is_refused_without_moving_anything() -> None:
    ledger = ledger_with_gpus("g1")
    ledger.bind(alloc("a"))
    out = ledger.resize("a", Fraction(10), 4 * GIB)
    assert out.outcome is Resized.REFUSED and out.message.startswith("nothing to change")


def test_a_copy_keeps_resize_memory() -> None:
    ledger = ledger_with_gpus("g1")
    ledger.bind(alloc("a"))
    ledger.resize("a", Fraction(20), None)
    other = ledger.copy()
    assert other.usage("g1").tflops == 20 * NANO
