"""What is allocated per GPU and per pod, with the DCGM UUID the usage queries join on, as the metrics expose
it."""

from __future__ import annotations

from extender.server.allocated import allocation_rows
from extender.server.metrics import Metrics
from tests.unit.fixtures.autoscale import autoscaled_worker, state_with


def test_allocations_per_gpu_and_pod_carry_dcgm_uuid() -> None:
    a = autoscaled_worker("a", "ua", "10")
    state = state_with(a)
    gpus, pods = allocation_rows(state, lambda name, namespace: a if name == "a" else None)
    (g,) = gpus
    assert g.gpu == "g1" and g.uuid == "g1" and g.tflops == 10
    (p,) = pods
    assert (p.namespace, p.pod, p.workload, p.uuid, p.tflops, p.vram) == ("ml", "a", "a", "g1", 10, 4 * 2**30)
    metrics = Metrics()
    metrics.set_allocations(gpus, pods)
    page = metrics.render().decode()
    assert 'tf_extender_pod_allocated_tflops{UUID="g1",namespace="ml",node="n1",pod="a",workload="a"} 10.0' \
        in page

