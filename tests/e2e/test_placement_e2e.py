"""Placement through the real kube-scheduler: pods created through the API server pass the webhook, the
GPU scheduler profile calls ``tf-extender serve``, and the pod lands on the node and GPUs that DESIGN §5
dictates.

Every test builds its own small cluster in a pool of its own. GPUs have 100 TFLOPS and 100Gi, so a GPU
holding ``x`` TFLOPS and ``x``Gi is ``x``% used.
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from tests import harness as cpl

pytestmark = pytest.mark.e2e

CAP = {"tflops": "100", "vram": "100Gi"}


class Cluster:
    """One test's nodes and GPUs, in one pool, and the pods that already hold some of them."""

    def __init__(self, api_client, namespace, make_node, make_gpu, extender, pool: str) -> None:
        self.api = api_client
        self.namespace = namespace
        self.make_node = make_node
        self.make_gpu = make_gpu
        self.extender = extender
        self.pool = pool
        self.prefix = uuid.uuid4().hex[:6]
        self.used: dict[str, float] = {}  # node -> sum of its GPUs' used percent
        self.gpu_count: dict[str, int] = {}

    def node(self, short: str, gpus: int = 1, pool: str | None = None, **gpu_kw) -> str:
        """A node ``<prefix>-<short>`` with GPUs ``<node>-gpu-<i>``: GPU objects first, then the Node."""
        name = f"{self.prefix}-{short}"
        for i in range(gpus):
            self.make_gpu(f"{name}-gpu-{i}", name, pool=pool or self.pool, index=i, **{**CAP, **gpu_kw})
        self.make_node(name)
        self.used[name] = 0.0
        self.gpu_count[name] = gpus
        return name

    def load(self, node: str, gpu: int, percent: int) -> None:
        """A pod already holding ``percent`` of GPU ``gpu`` of ``node`` (100 TFLOPS / 100Gi GPUs)."""
        name = f"load-{node}-{gpu}"
        cpl.place_by_hand(self.api, self.namespace, name, self.pool, node, [f"{node}-gpu-{gpu}"],
                          tflops=str(percent), vram=f"{percent}Gi")
        self.used[node] += percent

    def ready(self) -> None:
        """Until the extender sees every node with its GPUs and its pre-existing load."""
        for node, used in self.used.items():
            self.extender.wait_node_allocated(node, used / self.gpu_count[node])

    def pod(self, name: str, **kw) -> None:
        kw.setdefault("pool", self.pool)
        cpl.create_pod(self.api, self.namespace, cpl.gpu_pod_body(name, **kw))

    def placement(self, name: str) -> tuple[str, list[str]]:
        return cpl.placement(self.api, self.namespace, name, timeout=60)


@pytest.fixture
def gpus(api_client, gpu_cluster, namespace, make_node, make_gpu, extender, make_pool):
    def factory(mode: str | None = None, pool: str | None = None) -> Cluster:
        return Cluster(api_client, namespace, make_node, make_gpu, extender, pool or make_pool(mode))

    return factory


# Two nodes of two GPUs. a: gpu-0 60% used, gpu-1 idle (mean 30%). b: gpu-0 20%, gpu-1 10% (mean 15%).
# Two pods of 10% each, one after the other:
#   CompactFirst          busiest node a, busiest GPU a-0; then a-0 again (70% > 0%)
#   LowLoadFirst          idlest node b, idlest GPU b-1; then b (mean 20% < 35%) where b-0 and b-1 tie at 20%:
#                         the name decides, b-gpu-0
#   NodeCompactGPULowLoad busiest node a, idlest GPU a-1; then a (35%) and its idlest GPU a-1 (10% < 60%)
@pytest.mark.parametrize(
    ("mode", "first", "second"),
    [
        ("CompactFirst", ("a", 0), ("a", 0)),
        ("LowLoadFirst", ("b", 1), ("b", 0)),
        ("NodeCompactGPULowLoad", ("a", 1), ("a", 1)),
    ],
)
def test_placement_mode_picks_node_and_gpu(gpus, mode, first, second):
    c = gpus(mode)
    a, b = c.node("a", gpus=2), c.node("b", gpus=2)
    c.load(a, 0, 60)
    c.load(b, 0, 20)
    c.load(b, 1, 10)
    c.ready()
    nodes = {"a": a, "b": b}

    c.pod("first", tflops="10", vram="10Gi")
    assert c.placement("first") == (nodes[first[0]], [f"{nodes[first[0]]}-gpu-{first[1]}"])
    c.pod("second", tflops="10", vram="10Gi")
    assert c.placement("second") == (nodes[second[0]], [f"{nodes[second[0]]}-gpu-{second[1]}"])


def test_pool_without_template_places_node_compact_gpu_low_load(gpus):
    c = gpus(mode=None)
    a, b = c.node("a", gpus=2), c.node("b", gpus=2)
    c.load(a, 0, 60)
    c.load(b, 0, 20)
    c.ready()
    c.pod("p", tflops="10", vram="10Gi")
    assert c.placement("p") == (a, [f"{a}-gpu-1"])


def test_two_gpu_pod_gets_two_gpus_of_one_node(gpus):
    c = gpus("NodeCompactGPULowLoad")
    single = c.node("single", gpus=1)  # the busier node, but it has one GPU only
    double = c.node("double", gpus=2)
    c.load(single, 0, 50)
    c.ready()
    c.pod("pair", tflops="20", vram="20Gi", gpu_count=2)
    node, ids = c.placement("pair")
    assert node == double
    assert sorted(ids) == [f"{double}-gpu-0", f"{double}-gpu-1"]


def test_model_and_vendor_pick_the_matching_gpu(gpus):
    c = gpus("CompactFirst")
    a100 = c.node("a100", model="A100", vendor="NVIDIA")
    h100 = c.node("h100", model="H100", vendor="NVIDIA")
    mi300 = c.node("mi300", model="MI300X", vendor="AMD")
    c.load(a100, 0, 50)  # CompactFirst's favourite for any pod that may go there
    c.ready()

    c.pod("any", tflops="10", vram="10Gi")
    c.pod("hopper", tflops="10", vram="10Gi", model="H100")
    c.pod("amd", tflops="10", vram="10Gi", vendor="AMD")
    assert c.placement("any") == (a100, [f"{a100}-gpu-0"])
    assert c.placement("hopper") == (h100, [f"{h100}-gpu-0"])
    assert c.placement("amd") == (mi300, [f"{mi300}-gpu-0"])


def test_pod_stays_in_its_pool(gpus, make_pool):
    other_pool = make_pool("CompactFirst")
    c = gpus("CompactFirst")
    mine = c.node("mine")
    theirs = c.node("theirs", pool=other_pool)
    c.load(mine, 0, 10)
    c.ready()
    c.pod("theirs-pod", tflops="10", vram="10Gi", pool=other_pool)
    c.pod("my-pod", tflops="10", vram="10Gi")
    assert c.placement("theirs-pod") == (theirs, [f"{theirs}-gpu-0"])
    assert c.placement("my-pod") == (mine, [f"{mine}-gpu-0"])


def test_shared_pod_takes_a_whole_idle_gpu(api_client, namespace, gpus):
    c = gpus("CompactFirst")
    node = c.node("n", gpus=2)
    c.load(node, 0, 10)
    c.ready()

    # CompactFirst would put a soft pod on the busier gpu-0; a shared pod needs an idle GPU, whole
    c.pod("whole", tflops="10", vram="10Gi", isolation="shared")
    assert c.placement("whole") == (node, [f"{node}-gpu-1"])
    # gpu-1 is taken whole: a soft pod goes to gpu-0, however little it asks
    c.pod("small", tflops="1", vram="1Gi")
    assert c.placement("small") == (node, [f"{node}-gpu-0"])
    # no idle GPU is left for a second shared pod
    c.pod("whole-2", tflops="1", vram="1Gi", isolation="shared", qos="medium")
    message = cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, "whole-2"), 60,
                             what="whole-2 unschedulable")
    assert f"need 1 idle GPU in pool {c.pool}; 0 idle" in message, message


def _failed_scheduling(api_client, namespace: str, name: str, text: str) -> tuple[str, str]:
    """Until the pod's PodScheduled condition and a FailedScheduling event both carry ``text``."""
    def both() -> tuple[str, str] | None:
        condition = cpl.scheduling_failure(api_client, namespace, name) or ""
        events = [e.message for e in cpl.pod_events(api_client, namespace, name, "FailedScheduling")]
        event = next((m for m in events if text in m), None)
        return (condition, event) if text in condition and event else None

    return cpl.wait_until(both, 60, what=f"{name}: FailedScheduling naming {text!r}")


def test_a_pod_turned_away_is_retried_once_the_extender_sees_room_kube_scheduler_cannot_see(
        api_client, namespace, gpus):
    """kube-scheduler does not watch GPU objects: room that appears only there (a GPU's capacity corrected
    upwards) is no event to it, and without the extender's nudge the pod would wait for the scheduler's
    periodic retry of parked pods, 5 minutes later."""
    c = gpus("CompactFirst")
    node = c.node("n", tflops="10", vram="10Gi")
    c.ready()
    c.pod("wants-50", tflops="50", vram="50Gi", qos="medium")
    _failed_scheduling(api_client, namespace, "wants-50", "request 50 TFLOPS exceeds the largest GPU here")

    custom = client.CustomObjectsApi(api_client)
    room = {"tflops": "100", "vram": "100Gi"}
    custom.patch_cluster_custom_object_status(cpl.TF_GROUP, cpl.TF_VERSION, "gpus", f"{node}-gpu-0",
                                              {"status": {"capacity": room, "available": room}})
    # 60 s, stretched by TF_E2E_TIMEOUT_SCALE (3 by default), stays below the scheduler's 5-minute retry
    assert c.placement("wants-50") == (node, [f"{node}-gpu-0"])
    annotations = client.CoreV1Api(api_client).read_node(node).metadata.annotations or {}
    assert "tensor-fusion.ai/gpu-room-seen" in annotations
    assert (c.extender.metric("tf_extender_scheduler_nudges_total", outcome="sent") or 0) >= 1


def test_pod_that_does_not_fit_stays_pending_and_says_why(api_client, namespace, gpus):
    c = gpus("NodeCompactGPULowLoad")
    node = c.node("n")
    c.load(node, 0, 60)
    c.ready()

    # QoS medium: no priority above the load's, so nothing is preempted for these pods
    c.pod("too-busy", tflops="50", vram="50Gi", qos="medium")
    condition, _ = _failed_scheduling(
        api_client, namespace, "too-busy",
        f"need 1 GPU with 50 TFLOPS and 50Gi VRAM free in pool {c.pool}; 0 fit, "
        "best other GPU has 40 TFLOPS and 40Gi free",
    )
    assert condition.startswith("0/"), condition  # the scheduler's "0/N nodes are available: ..."

    c.pod("too-big", tflops="150", vram="10Gi", qos="medium")
    _failed_scheduling(api_client, namespace, "too-big",
                       "request 150 TFLOPS exceeds the largest GPU here (100 TFLOPS)")
    c.pod("two-of-one", tflops="1", vram="1Gi", gpu_count=2, qos="medium")
    _failed_scheduling(api_client, namespace, "two-of-one",
                       f"need 2 matching GPUs in pool {c.pool} on one node; this node has 1")

    core = client.CoreV1Api(api_client)
    for name in ("too-busy", "too-big", "two-of-one"):
        pod = core.read_namespaced_pod(name, namespace)
        assert pod.spec.node_name is None and pod.status.phase == "Pending"
