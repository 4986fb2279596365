"""What is allocated per GPU and per pod, with the DCGM UUID the usage queries join on, as the metrics expose
it."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from extender.server.allocated import allocation_rows
from extender.server.metrics import GPUAllocated, Metrics, NodeUse, PodAllocated
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



def _rows(n: int) -> tuple[list[GPUAllocated], list[PodAllocated]]:
    gpus = [GPUAllocated(f"GPU-{i}", f"g{i}", f"n{i // 8}", "pool", "H100", 989.0, 80 * 2**30, 10.0, 2**30)
            for i in range(n)]
    pods = [PodAllocated("ml", f"p{i}", 'we"ird\\name', f"n{i // 8}", f"GPU-{i}", 10.0, 2**30)
            for i in range(n)]
    return gpus, pods


def test_rows_render_as_prometheus_client_would_and_a_pod_twice_on_one_gpu_sums() -> None:
    gpus, pods = _rows(3)
    metrics = Metrics()
    metrics.set_allocations(gpus, [*pods, pods[0]])
    metrics.set_utilisation([NodeUse("n0", "pool", 25.0, 50.0)], [], 0)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    held = {s.labels["pod"]: s.value for s in families["tf_extender_pod_allocated_tflops"].samples}
    assert held == {"p0": 20.0, "p1": 10.0, "p2": 10.0}
    (sample, *_) = families["tf_extender_pod_allocated_vram_bytes"].samples
    assert sample.labels["workload"] == 'we"ird\\name'  # escaped and read back
    assert len(families["tf_extender_gpu_capacity_vram_bytes"].samples) == 3
    ratios = families["tf_extender_node_allocated_ratio"].samples
    assert {(s.labels["resource"], s.value) for s in ratios} == {("tflops", 0.25), ("vram", 0.5)}


def test_a_scrape_of_many_rows_lets_the_verbs_run_between_slices() -> None:
    """At a thousand nodes the rows are tens of thousands: a scrape made them in one go, holding every
    filter and bind for seconds. Now the event loop runs other work between slices, and the page is the
    one the synchronous render makes."""
    gpus, pods = _rows(5000)
    metrics = Metrics()

    async def rows() -> tuple[list[GPUAllocated], list[PodAllocated]]:
        return gpus, pods

    metrics.on_scrape(lambda: None, rows)

    async def scrape() -> tuple[bytes, int]:
        ticks = 0
        done = asyncio.Event()

        async def verbs() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(verbs())
        page = await metrics.render_async()
        done.set()
        await task
        return page, ticks

    page, ticks = asyncio.run(scrape())
    assert ticks >= 20  # 5,000 GPUs and 5,000 pods in slices of 500 rows
    metrics.on_scrape(lambda: None)
    assert page == metrics.render()
