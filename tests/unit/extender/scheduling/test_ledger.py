"""Ledger: per-GPU usage from bound pods and reservations, counted once, in any event order."""

from __future__ import annotations

import pytest

from extender.common.contract import GPURequest, Isolation
from extender.scheduling.inventory import NANO
from extender.scheduling.ledger import Allocation, Distrust, Ledger, Usage
from tests.unit.fixtures.scheduling import alloc, ledger_with_gpus, request

GIB = 1 << 30


@pytest.mark.parametrize(
    ("req", "expected"),
    [
        (request("10", 4 * GIB), Usage(10 * NANO, 4 * GIB, 0)),
        (request(None, 2 * GIB, percent="25"), Usage(25 * NANO, 2 * GIB, 0)),
        (request(None, 0, percent="33.3"), Usage(33_300_000_000, 0, 0)),
        (request(None, 0, isolation=Isolation.SHARED), Usage(100 * NANO, 40 * GIB, 1)),
    ],
)
def test_one_pod_holds_its_share_of_the_gpu(req: GPURequest, expected: Usage) -> None:
    ledger = ledger_with_gpus("g1")
    ledger.bind(alloc("a", req=req))
    assert ledger.usage("g1") == expected


def test_multi_gpu_pod_holds_its_request_on_each_gpu() -> None:
    ledger = ledger_with_gpus("g1", "g2", "g3")
    ledger.bind(alloc("a", ("g1", "g2")))
    assert [ledger.usage(g).tflops for g in ("g1", "g2", "g3")] == [10 * NANO, 10 * NANO, 0]
    assert ledger.pods_on("n1") == 1


def test_bound_pod_replaces_its_reservation_and_is_not_counted_twice() -> None:
    ledger = ledger_with_gpus("g1")
    ledger.reserve(alloc("a"))
    ledger.bind(alloc("a"))
    assert ledger.usage("g1").tflops == 10 * NANO
    ledger.release(alloc("a"))  # a late release changes nothing once the pod shows the allocation
    assert ledger.usage("g1").tflops == 10 * NANO


def test_bound_record_replaces_an_equal_reservation() -> None:
    # The watched pod's allocation equals the extender's own reservation: the ledger must hand out the
    # bound record, so callers that check ``bound(uid) is allocation`` (preemption) see a bound pod.
    ledger = ledger_with_gpus("g1")
    ledger.reserve(alloc("a"))
    bound = alloc("a")
    ledger.bind(bound)
    assert ledger.allocations_on("n1")[0] is bound is ledger.bound("a")
    assert ledger.usage("g1").tflops == 10 * NANO


def test_release_is_idempotent_and_ignores_stale_reservations() -> None:
    ledger = ledger_with_gpus("g1", "g2")
    first, second = alloc("a", ("g1",)), alloc("a", ("g2",))
    ledger.reserve(first)
    ledger.reserve(second)
    ledger.release(first)
    assert (ledger.usage("g1").tflops, ledger.usage("g2").tflops) == (0, 10 * NANO)
    ledger.release(second)
    ledger.release(second)
    assert ledger.usage("g2") == Usage() and ledger.pods_on("n1") == 0


def test_unbind_keeps_a_reservation_in_flight_but_forget_drops_it() -> None:
    ledger = ledger_with_gpus("g1")
    ledger.reserve(alloc("a"))
    ledger.unbind("a")
    assert ledger.usage("g1").tflops == 10 * NANO
    ledger.forget("a")
    assert ledger.usage("g1") == Usage()


def test_gpu_arriving_after_the_pod_counts_the_pod() -> None:
    ledger = Ledger()
    ledger.bind(alloc("a", req=request(None, GIB, percent="50")))
    assert ledger.usage("g1") == Usage()
    ledger.set_gpu("g1", "n1", 200 * NANO, 40 * GIB)
    assert ledger.usage("g1") == Usage(100 * NANO, GIB, 0)
    ledger.set_gpu("g1", "n1", 100 * NANO, 40 * GIB)  # capacity changed: percent share follows
    assert ledger.usage("g1") == Usage(50 * NANO, GIB, 0)
    ledger.forget("a")
    assert ledger.usage("g1") == Usage()


def test_touched_nodes_are_reported_for_cache_invalidation() -> None:
    ledger = ledger_with_gpus("g1")
    assert ledger.bind(alloc("a")) == {"n1"}
    assert ledger.bind(alloc("a")) == set()
    assert ledger.forget("a") == {"n1"}


# --- distrust: a pod's claim counts only when it is the ledger's own grant, or fits ----------------------

class Findings:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def __call__(self, allocation: Allocation, reason: Distrust, message: str) -> None:
        self.seen.append((allocation.uid, reason.value, message))


def distrusting(*gpus: tuple[str, str]) -> tuple[Ledger, Findings]:
    findings = Findings()
    ledger = Ledger(findings)
    for name, node in gpus:
        ledger.set_gpu(name, node, 100 * NANO, 40 * GIB)
    return ledger, findings


def test_a_forged_allocation_never_takes_a_gpu_over_capacity() -> None:
    ledger, findings = distrusting(("g1", "n1"))
    ledger.bind(alloc("a", req=request("80")))
    ledger.bind(alloc("forged", req=request("80")))  # read from a pod nobody granted it to
    assert ledger.usage("g1").tflops == 80 * NANO
    assert ledger.allocation("forged") is None
    assert [(uid, reason) for uid, reason, _ in findings.seen] == [("forged", "over_capacity")]
    assert "ns/forged" in findings.seen[0][2] and "g1" in findings.seen[0][2]
    ledger.bind(alloc("forged", req=request("80")))  # the same pod again: reported once
    assert len(findings.seen) == 1
    ledger.forget("a")  # room again: the refused pod (it does run there) is counted now
    assert ledger.usage("g1").tflops == 80 * NANO and ledger.allocation("forged") is not None


def test_a_gpu_of_another_node_is_not_counted() -> None:
    ledger, findings = distrusting(("g1", "n1"), ("g2", "n2"))
    ledger.bind(alloc("a", gpus=("g2",), node="n1"))
    assert ledger.usage("g2") == Usage() and ledger.allocation("a") is None
    assert findings.seen[0][1] == "node_mismatch" and "node n2" in findings.seen[0][2]


def test_a_gpu_learned_late_drops_the_latest_claims_that_do_not_fit() -> None:
    ledger, findings = distrusting()
    for uid in ("a", "b", "c"):  # pods listed before their GPU object
        ledger.bind(alloc(uid, req=request("40")))
    ledger.set_gpu("g1", "n1", 100 * NANO, 40 * GIB)
    assert ledger.usage("g1").tflops == 80 * NANO
    assert {a.uid for a in ledger.allocations()} == {"a", "b"}
    assert [uid for uid, _, _ in findings.seen] == ["c"]


def test_the_ledgers_own_grant_counts_with_the_amounts_it_granted() -> None:
    ledger, findings = distrusting(("g1", "n1"))
    ledger.reserve(alloc("a", req=request("80")))
    ledger.bind(alloc("a", req=request("0")))  # the pod's record says less than was granted
    assert ledger.usage("g1").tflops == 80 * NANO and ledger.trusted("a")
    assert findings.seen == []


def test_a_record_changed_after_the_bind_is_not_believed() -> None:
    ledger, findings = distrusting(("g1", "n1"))
    ledger.reserve(alloc("a", req=request("80")))
    ledger.bind(alloc("a", req=request("80")))
    ledger.bind(alloc("a", req=request("0")))  # tflops-request patched to 0 after the bind
    ledger.bind(alloc("a", gpus=("g2",)))
    assert ledger.usage("g1").tflops == 80 * NANO
    assert [reason for _, reason, _ in findings.seen] == ["record_changed"]  # once, not per update
    ledger.record_lost(ledger.bound("a"))  # type: ignore[arg-type]
    assert ledger.usage("g1").tflops == 80 * NANO and len(findings.seen) == 2
