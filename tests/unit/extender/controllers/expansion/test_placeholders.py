"""Placeholder pods for the Cluster Autoscaler: their shape, one per node's worth of pending demand, and
their removal, through the expander as the filter drives it (in-memory cluster, hand-driven clock)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from extender.common.contract import POOL_LABEL, parse_request
from extender.common.labels import (
    NODE_PROVISIONER,
    NVIDIA_GPU,
    PLACEHOLDER_FOR,
    PLACEHOLDER_FOR_UID,
    PLACEHOLDER_LABEL,
    SAFE_TO_EVICT,
)
from extender.controllers.expansion.config import ExpansionConfig
from extender.controllers.expansion.detect import REASON_COMPLETED, REASON_FAILED
from extender.controllers.expansion.placeholder_pods import placeholder_body, pod_cpu_memory
from extender.controllers.expansion.placeholders import REASON_WAITING, Placeholders
from extender.controllers.expansion.provisioner import AutoscalerConfig, Provisioner, pool_provisioner
from extender.controllers.expansion.worker import Expander
from extender.scheduling.state import FilterOutcome
from tests.unit.fixtures.expansion import CAPACITY_ONLY, Clock, FakePort, gpu, later

NS = "tensor-fusion-sys"
FITS = FilterOutcome(["n1"], {}, {}, None, False)
OWNER = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
         "metadata": {"name": "tensor-fusion-placeholder", "uid": "pc-uid"}}


class CAPort(FakePort):
    """FakePort plus the placeholder side: created pods land in ``placeholders`` (the watch cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.placeholders: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.fail_pod_create: Exception | None = None

    def gpu_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.pods.get(f"{namespace}/{name}")

    def placeholder_pods(self) -> Sequence[Mapping[str, Any]]:
        return list(self.placeholders.values())

    async def placeholder_owner(self) -> Mapping[str, Any] | None:
        return OWNER

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.fail_pod_create is not None:
            raise self.fail_pod_create
        name = body["metadata"]["name"]
        if name in self.placeholders:
            raise ApiException(status=409, reason="AlreadyExists")
        created = copy.deepcopy(body)
        created["metadata"]["uid"] = f"uid-{name}"
        self.placeholders[name] = created
        return created

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append(name)
        self.placeholders.pop(name, None)

    def add_plain_template(self, node: str = "n1", gpus: int = 1) -> None:
        """A GPU node no Karpenter NodeClaim owns (a Cluster Autoscaler node group's node)."""
        self.nodes[node] = {"metadata": {"name": node, "labels": {POOL_LABEL: "pool-a"}}, "spec": {},
                            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", NVIDIA_GPU: str(gpus)}}}
        self.gpus[node] = [gpu(f"{node}-g{i}", node) for i in range(gpus)]


def make(port: CAPort, provisioner: Provisioner = Provisioner.AUTO) -> tuple[Expander, Clock]:
    clock = Clock()
    expander = Expander(ExpansionConfig(delay_seconds=10.0), port, clock=clock)
    expander.placeholders = Placeholders(AutoscalerConfig(provisioner=provisioner, namespace=NS), port,
                                         forget=expander.flagged.forget, clock=clock)
    return expander, clock


@pytest.fixture
def port() -> CAPort:
    p = CAPort()
    p.add_plain_template()
    return p


def requests_of(body: Mapping[str, Any]) -> dict[str, str]:
    return dict(body["spec"]["containers"][0]["resources"]["requests"])


# --- shape -------------------------------------------------------------------------------------------


def user_pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "team", "uid": "u-1", "annotations": {
        "tensor-fusion.ai/gpupool": "pool-a", "tensor-fusion.ai/tflops-request": "10",
        "tensor-fusion.ai/vram-request": "8Gi", "tensor-fusion.ai/gpu-count": "2"}},
        "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}},
                                {"name": "b", "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}}],
                 **spec}}


def test_a_placeholder_asks_for_what_the_in_tree_plugins_see() -> None:
    toleration = {"key": NVIDIA_GPU, "operator": "Exists", "effect": "NoSchedule"}
    required = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}]}]}
    pod = user_pod(
        tolerations=[toleration], nodeSelector={"disk": "ssd"},
        initContainers=[{"name": "init", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}],
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required,
                                   "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]},
                  "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                      {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "h"}]}})
    request = parse_request(pod["metadata"]["annotations"])
    body = placeholder_body(pod, request, namespace=NS, image="pause", scheduler_name="default-scheduler",
                            priority_class="tensor-fusion-placeholder", template_node="n1",
                            template_labels={POOL_LABEL: "pool-a"}, owner=OWNER)
    assert body["metadata"]["namespace"] == NS
    assert body["metadata"]["labels"][PLACEHOLDER_LABEL] == "true"
    assert body["metadata"]["labels"][PLACEHOLDER_FOR_UID] == "u-1"
    assert body["metadata"]["annotations"][PLACEHOLDER_FOR] == "team/train"
    assert body["metadata"]["annotations"][SAFE_TO_EVICT] == "true"
    assert body["metadata"]["ownerReferences"] == [{
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "name": "tensor-fusion-placeholder",
        "uid": "pc-uid", "controller": False, "blockOwnerDeletion": False}]
    spec = body["spec"]
    # whole GPUs for gpu-count 2; cpu: the init container (4) beats the containers' sum (2)
    assert requests_of(body) == {NVIDIA_GPU: "2", "cpu": "4", "memory": "3Gi"}
    assert spec["containers"][0]["resources"]["limits"] == {NVIDIA_GPU: "2"}
    assert spec["tolerations"] == [toleration]
    assert spec["nodeSelector"] == {"disk": "ssd", POOL_LABEL: "pool-a"}
    assert spec["affinity"]["nodeAffinity"] == {"requiredDuringSchedulingIgnoredDuringExecution": required}
    (term,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["namespaces"] == ["team"]  # still about the pod's own namespace
    assert spec["priorityClassName"] == "tensor-fusion-placeholder"
    assert spec["preemptionPolicy"] == "Never"
    assert spec["schedulerName"] == "default-scheduler"
    assert "nodeName" not in spec


@pytest.mark.parametrize(("spec", "cpu", "memory"), [
    ({}, 0, 0),
    ({"containers": [{"resources": {"requests": {"cpu": "250m"}}}]}, "1/4", 0),
    ({"containers": [{"resources": {"requests": {"cpu": "1"}}}, {"resources": {"requests": {"cpu": "1"}}}],
      "overhead": {"cpu": "100m", "memory": "1Ki"}}, "21/10", 1024),
    ({"containers": [{"resources": {"requests": {"cpu": "nonsense", "memory": "1Mi"}}}]}, 0, 1 << 20),
])
def test_pod_cpu_and_memory_count_like_the_scheduler(spec: dict[str, Any], cpu: Any, memory: int) -> None:
    from fractions import Fraction

    assert pod_cpu_memory({"spec": spec}) == (Fraction(cpu), Fraction(memory))


@pytest.mark.parametrize(("annotation", "default", "expected"), [
    (None, Provisioner.AUTO, Provisioner.AUTO),
    ("cluster-autoscaler", Provisioner.AUTO, Provisioner.CLUSTER_AUTOSCALER),
    ("Karpenter", Provisioner.CLUSTER_AUTOSCALER, Provisioner.KARPENTER),
    ("something-else", Provisioner.KARPENTER, Provisioner.KARPENTER),
])
def test_the_pool_annotation_overrides_the_flag(annotation: str | None, default: Provisioner,
                                                 expected: Provisioner) -> None:
    pool = {"metadata": {"annotations": {NODE_PROVISIONER: annotation} if annotation else {}}}
    assert pool_provisioner(pool, default) is expected


# --- lifecycle through the expander ---------------------------------------------------------------------


async def test_no_karpenter_template_means_a_placeholder_and_an_event_naming_it(port: CAPort) -> None:
    expander, clock = make(port)
    pod = port.add_pod("p")
    for _ in range(3):
        expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.created == []  # no NodeClaim
    (placeholder,) = port.placeholders.values()
    assert requests_of(placeholder) == {NVIDIA_GPU: "1"}
    (message,) = port.messages("p", REASON_COMPLETED)
    assert f"{NS}/{placeholder['metadata']['name']}" in message
    assert expander.placeholders is not None
    assert expander.placeholders.created.labels(pool="pool-a")._value.get() == 1
    assert REASON_FAILED not in port.reasons("p")


async def test_pods_that_fit_the_node_a_placeholder_asks_for_create_none(port: CAPort) -> None:
    expander, clock = make(port)
    small = [port.add_pod(f"s{i}", vram="20Gi") for i in range(3)]  # 3 x 20Gi fit one 80Gi GPU
    big = port.add_pod("big", vram="60Gi")  # does not fit what is left
    other = port.add_pod("other", vram="20Gi", nodeSelector={"zone": "b"})  # other constraints
    for pod in [*small, big, other]:
        expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    owners = sorted(p["metadata"]["annotations"][PLACEHOLDER_FOR] for p in port.placeholders.values())
    assert owners == ["ns/big", "ns/other", "ns/s0"]
    assert [port.reasons(f"s{i}")[-1] for i in (1, 2)] == [REASON_WAITING, REASON_WAITING]


@pytest.mark.parametrize(("case", "change"), [
    ("bound", lambda port: port.pods["ns/p"]["spec"].update(nodeName="n2")),
    ("deleted", lambda port: port.pods.pop("ns/p")),
    ("finished", lambda port: port.pods["ns/p"]["status"].update(phase="Succeeded")),
])
async def test_the_placeholder_goes_when_its_pod_no_longer_needs_it(port: CAPort, case: str,
                                                                    change: Any) -> None:
    expander, clock = make(port)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    await later(expander, clock, 1)
    assert len(port.placeholders) == 1
    change(port)
    await later(expander, clock, 1)
    assert port.placeholders == {} and len(port.deleted) == 1, case


async def test_the_placeholder_goes_when_the_pod_stops_being_capacity_only(port: CAPort) -> None:
    expander, clock = make(port)
    pod = port.add_pod("p")
    rider = port.add_pod("r", vram="10Gi")
    expander.notice(pod, CAPACITY_ONLY, ["n1"])
    expander.notice(rider, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    expander.notice(pod, CAPACITY_ONLY, ["n1"])  # still capacity-only: kept
    await later(expander, clock, 1)
    assert len(port.placeholders) == 1
    expander.notice(pod, FITS, ["n1"])  # a node has room now
    await later(expander, clock, 1)
    assert port.placeholders == {}
    # both may be flagged again: a later capacity-only failure makes a new placeholder
    expander.notice(rider, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    (placeholder,) = port.placeholders.values()
    assert placeholder["metadata"]["annotations"][PLACEHOLDER_FOR] == "ns/r"


async def test_placeholders_left_by_a_previous_run_are_adopted_or_removed(port: CAPort) -> None:
    first, clock = make(port)
    for name in ("keep", "gone"):
        first.notice(port.add_pod(name), CAPACITY_ONLY, ["n1"])
    await later(first, clock, 10)
    assert len(port.placeholders) == 2
    port.pods.pop("ns/gone")
    second, clock = make(port)  # a restart: nothing in memory
    await later(second, clock, 1)
    (kept,) = port.placeholders.values()
    assert kept["metadata"]["annotations"][PLACEHOLDER_FOR] == "ns/keep"
    assert second.placeholders is not None and second.placeholders.waiting_on("uid-keep") is not None
    # an adopted placeholder still takes riders
    second.notice(port.add_pod("rider", vram="10Gi"), CAPACITY_ONLY, ["n1"])
    await later(second, clock, 10)
    assert len(port.placeholders) == 1 and port.reasons("rider")[-1] == REASON_WAITING


async def test_a_pool_marked_for_the_cluster_autoscaler_never_gets_a_nodeclaim() -> None:
    port = CAPort()
    port.add_template()  # a Karpenter template exists...
    port.gpupools["pool-a"] = {"metadata": {"name": "pool-a",
                                            "annotations": {NODE_PROVISIONER: "cluster-autoscaler"}}}
    expander, clock = make(port)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.created == [] and len(port.placeholders) == 1  # ...but the pool is the autoscaler's


async def test_karpenter_only_keeps_the_old_answer(port: CAPort) -> None:
    expander, clock = make(port, Provisioner.KARPENTER)
    expander.notice(port.add_pod("p"), CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert port.placeholders == {} and port.reasons("p")[-1] == REASON_FAILED


async def test_a_failed_create_is_reported_and_retried_at_the_next_rejection(port: CAPort) -> None:
    expander, clock = make(port)
    pod = port.add_pod("p")
    port.fail_pod_create = RuntimeError("PriorityClass tensor-fusion-placeholder is not installed")
    expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert "is not installed" in port.messages("p", REASON_FAILED)[0]
    port.fail_pod_create = None
    expander.notice(pod, CAPACITY_ONLY, ["n1"])
    await later(expander, clock, 10)
    assert len(port.placeholders) == 1
