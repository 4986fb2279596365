"""The real Karpenter (its KWOK cloud provider, built by build-control-plane.sh) on the e2e control plane.

A test module gets its own Karpenter with a fixture made by ``karpenter_fixture``::

    karpenter = karpenter_fixture(node_overlay=True)          # module scoped

    def test_x(karpenter, ...):
        pool = karpenter.nodepool("my-gpupool")               # NodePool of one GPU instance type
        ...

What it sets up:

- Karpenter's CRDs (NodePool, NodeClaim, NodeOverlay, KWOKNodeClass) from the build cache, the very module
  version of the binary;
- ``karpenter`` run outside a cluster as its docs say: ``KUBECONFIG``, ``DISABLE_LEADER_ELECTION=true``,
  ``FEATURE_GATES`` with ``NodeOverlay=<bool>``, ``INSTANCE_TYPES_FILE_PATH`` (``GPU_INSTANCE_TYPES``),
  ``METRICS_PORT``/``HEALTH_PROBE_PORT`` on free ports, a short provisioning batch window
  (``BATCH_IDLE_DURATION``/``BATCH_MAX_DURATION``); its log is collected with the other processes' and it
  is stopped by process group at module end (and at exit);
- a KWOKNodeClass ``default`` (``node_class()`` makes others, e.g. with a ``nodeRegistrationDelay``);
- with ``node_overlay=True`` the NodeOverlay the project ships (manifests/optional, TensorFusion's
  ``tensor-fusion-overlay``), which declares the ``tensor-fusion.ai/index_*`` resources on every NodePool.

How Karpenter's nodes carry GPUs for the extender: a NodePool made by ``nodepool()`` pins one instance type
and its template carries GPU discovery labels (``nvidia.com/gpu.count``/``.product``/``.memory``, as NVIDIA
GPU Feature Discovery would put on the node) and the pool label ``tensor-fusion.ai/gpupool``. Karpenter copies
template labels to the NodeClaim and the Node, so the extender (``--inventory-source auto``) sees the GPUs as
soon as the node registers. ``give_gpus()`` instead creates TensorFusion GPU objects for a node, as the
TensorFusion node agent would. The Nodes Karpenter's KWOK provider creates carry ``kwok.x-k8s.io/node=fake``,
so the session's kwok makes them Ready. Their ``kubernetes.io/hostname`` label is the NodeClaim's name, not
the Node's; GPU objects name the Node.

Nodes advertising ``index_*`` (``index_on_nodes=True``): the KWOK provider does not apply NodeOverlay capacity
to the Nodes it creates, but it does give them the resources of their instance type, so the instance types
then declare ``tensor-fusion.ai/index_*`` themselves, as a real TensorFusion node's device plugin does.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .controlplane import ControlPlane
from .manifests import MANIFESTS, apply_crds, load_yaml_docs
from .objects import DEFAULT_INDEX_CAPACITY, INDEX_RESOURCES, TF_GROUP, TF_VERSION, create_gpu
from .processes import ManagedProcess, free_port, http_ready, wait_until

KARPENTER = ("karpenter.sh", "v1")
OVERLAY = ("karpenter.sh", "v1alpha1")
KWOK_NODECLASS = ("karpenter.kwok.sh", "v1alpha1")
NODEPOOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
CAPACITY_TYPE = "karpenter.sh/capacity-type"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
GPU_NODE_LABEL = "tensor-fusion.ai/gpu-node"  # on GPU NodePools' templates (the earlier overlay selected it)
POOL_LABEL = "tensor-fusion.ai/gpupool"
HARNESS_LABEL = "e2e.tensor-fusion.ai/karpenter-harness"
OVERLAY_MANIFEST = MANIFESTS / "optional" / "karpenter-nodeoverlay.yaml"
ZONES = ("zone-a", "zone-b")


@dataclass(frozen=True)
class InstanceType:
    """One entry of the KWOK provider's instance-type file."""

    name: str
    gpus: int = 1
    gpu_product: str = "NVIDIA-A100-SXM4-80GB"  # a product the extender's GPU model table knows
    gpu_memory_mib: int = 81920
    cpu: str = "16"
    memory: str = "64Gi"
    price: float = 1.0
    zones: tuple[str, ...] = ZONES

    def entry(self, index_resources: bool) -> dict[str, Any]:
        resources: dict[str, str] = {"cpu": self.cpu, "memory": self.memory, "pods": "110",
                                     "ephemeral-storage": "100Gi"}
        if self.gpus:
            resources["nvidia.com/gpu"] = str(self.gpus)
            if index_resources:
                resources.update({r: DEFAULT_INDEX_CAPACITY for r in INDEX_RESOURCES})
        offerings = [
            {"Price": self.price, "Available": True, "Requirements": [
                {"key": CAPACITY_TYPE, "operator": "In", "values": ["on-demand"]},
                {"key": ZONE, "operator": "In", "values": [zone]}]}
            for zone in self.zones
        ]
        return {"name": self.name, "offerings": offerings, "architecture": "amd64",
                "operatingSystems": ["linux"], "resources": resources}

    def gpu_labels(self) -> dict[str, str]:
        """The labels GPU Feature Discovery would put on a node of this type."""
        if not self.gpus:
            return {}
        return {"nvidia.com/gpu.count": str(self.gpus), "nvidia.com/gpu.product": self.gpu_product,
                "nvidia.com/gpu.memory": str(self.gpu_memory_mib)}


GPU_INSTANCE_TYPES = (
    InstanceType("gpu-a100-1", gpus=1, price=1.0),
    InstanceType("gpu-a100-2", gpus=2, cpu="32", memory="128Gi", price=2.0),
    InstanceType("cpu-8", gpus=0, cpu="8", memory="32Gi", price=0.2),
)


@dataclass(frozen=True)
class KarpenterSettings:
    node_overlay: bool = False
    index_on_nodes: bool = False
    instance_types: tuple[InstanceType, ...] = GPU_INSTANCE_TYPES
    # Karpenter waits for a quiet gap of batch_idle (at most batch_max) before it provisions a batch.
    batch_idle: str = "1s"
    batch_max: str = "3s"
    log_level: str = "debug"
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self, kubeconfig: Path, instance_types_file: Path, metrics_port: int,
            health_port: int) -> dict[str, str]:
        gates = f"NodeRepair=false,ReservedCapacity=true,SpotToSpotConsolidation=false," \
                f"NodeOverlay={str(self.node_overlay).lower()},StaticCapacity=false"
        return {
            "KUBECONFIG": str(kubeconfig), "DISABLE_LEADER_ELECTION": "true", "FEATURE_GATES": gates,
            "INSTANCE_TYPES_FILE_PATH": str(instance_types_file), "METRICS_PORT": str(metrics_port),
            "HEALTH_PROBE_PORT": str(health_port), "BATCH_IDLE_DURATION": self.batch_idle,
            "BATCH_MAX_DURATION": self.batch_max, "LOG_LEVEL": self.log_level,
            "KUBE_CLIENT_QPS": "50", "KUBE_CLIENT_BURST": "100", **self.extra_env,
        }


def _ignore_404(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    try:
        return fn(*args, **kw)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None


class Karpenter:
    """A running Karpenter and the Karpenter objects the tests made (``reset()`` removes those)."""

    def __init__(self, cp: ControlPlane, api_client: Any, binary: Path, crds_dir: Path,
                 settings: KarpenterSettings) -> None:
        self.cp = cp
        self.api_client = api_client
        self.binary = Path(binary)
        self.crds_dir = Path(crds_dir)
        self.settings = settings
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.proc: ManagedProcess | None = None
        self.metrics_port = 0
        self.health_port = 0
        self.instance_types = {it.name: it for it in settings.instance_types}
        self._nodepools: list[str] = []
        self._nodeclasses: list[str] = []
        self._gpus: list[str] = []

    # -- process ------------------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> Karpenter:
        apply_crds(self.api_client, sorted(self.crds_dir.glob("*.yaml")))
        self.node_class("default")
        if self.settings.node_overlay:
            self._apply_overlay()
        types_file = self.cp.workdir / "karpenter-instance-types.json"
        types_file.write_text(json.dumps(
            [it.entry(self.settings.index_on_nodes) for it in self.settings.instance_types], indent=1))
        self.metrics_port, self.health_port = free_port(), free_port()
        env = self.settings.env(self.cp.kubeconfig, types_file, self.metrics_port, self.health_port)
        self.proc = self.cp.registry.start("karpenter", [self.binary], self.cp.log_dir,
                                           env={**env, "HOME": str(self.cp.workdir)})
        proc = self.proc
        wait_until(lambda: http_ready(f"http://127.0.0.1:{self.health_port}/readyz", proc),
                       timeout, interval=0.5, what="karpenter /readyz")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.cp.registry.forget(self.proc)
        self.proc = None

    def check_alive(self) -> None:
        if self.proc is not None:
            self.proc.check_alive()

    # -- objects ------------------------------------------------------------------------------------

    def _apply_overlay(self) -> None:
        body = load_yaml_docs(OVERLAY_MANIFEST)[0]
        with contextlib.suppress(ApiException):
            self.custom.delete_cluster_custom_object(*OVERLAY, "nodeoverlays", body["metadata"]["name"])
        wait_until(lambda: _ignore_404(self.custom.get_cluster_custom_object, *OVERLAY, "nodeoverlays",
                                           body["metadata"]["name"]) is None, 30, what="old overlay gone")
        self.custom.create_cluster_custom_object(*OVERLAY, "nodeoverlays", body)

    def node_class(self, name: str, registration_delay: str = "0s") -> str:
        """A KWOKNodeClass; ``registration_delay`` is how long its nodes take to appear (boot time)."""
        body = {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
                "metadata": {"name": name, "labels": {HARNESS_LABEL: "true"}},
                "spec": {"nodeRegistrationDelay": registration_delay}}
        current = _ignore_404(self.custom.get_cluster_custom_object, *KWOK_NODECLASS, "kwoknodeclasses", name)
        if current is None:
            self.custom.create_cluster_custom_object(*KWOK_NODECLASS, "kwoknodeclasses", body)
        else:
            self.custom.patch_cluster_custom_object(*KWOK_NODECLASS, "kwoknodeclasses", name,
                                                    {"spec": body["spec"]})
        if name not in self._nodeclasses:
            self._nodeclasses.append(name)
        return name

    def nodepool(self, pool: str, *, name: str | None = None, instance_type: str = "gpu-a100-1",
                 node_class: str = "default", consolidation: str = "WhenEmpty",
                 consolidate_after: str = "Never",
                 labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
                 zones: tuple[str, ...] = ZONES, taints: list[dict[str, Any]] | None = None,
                 gpu_labels: bool = True, budgets: list[dict[str, Any]] | None = None) -> str:
        """A NodePool of one instance type whose nodes belong to GPUPool ``pool`` (template labels: the
        pool, ``tensor-fusion.ai/gpu-node=true`` and, with ``gpu_labels``, the GPU discovery labels).
        Consolidation is off (``consolidate_after="Never"``) unless a test asks for it: an empty new node
        must not go before the pod it was bought for lands."""
        name = name or f"gpu-{uuid.uuid4().hex[:8]}"
        it = self.instance_types[instance_type]
        template_labels = {HARNESS_LABEL: "true", POOL_LABEL: pool, **(labels or {})}
        if it.gpus:
            template_labels[GPU_NODE_LABEL] = "true"
            if gpu_labels:
                template_labels.update(it.gpu_labels())
        spec: dict[str, Any] = {
            "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": node_class},
            "requirements": [
                {"key": INSTANCE_TYPE, "operator": "In", "values": [instance_type]},
                {"key": ZONE, "operator": "In", "values": list(zones)},
                {"key": CAPACITY_TYPE, "operator": "In", "values": ["on-demand"]},
            ],
            "expireAfter": "Never",
        }
        if taints:
            spec["taints"] = taints
        body = {
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": name, "labels": {HARNESS_LABEL: "true"}},
            "spec": {
                "template": {"metadata": {"labels": template_labels, "annotations": dict(annotations or {})},
                             "spec": spec},
                "disruption": {"consolidationPolicy": consolidation, "consolidateAfter": consolidate_after,
                               "budgets": budgets or [{"nodes": "100%"}]},
            },
        }
        self.custom.create_cluster_custom_object(*KARPENTER, "nodepools", body)
        self._nodepools.append(name)
        wait_until(lambda: self.nodepool_ready(name), 60, what=f"NodePool {name} Ready")
        return name

    def nodepool_ready(self, name: str) -> bool:
        obj = self.custom.get_cluster_custom_object(*KARPENTER, "nodepools", name)
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (obj.get("status") or {}).get("conditions") or [])

    def claims(self, nodepool: str | None = None, label_selector: str | None = None) -> list[dict[str, Any]]:
        selectors = [s for s in (f"{NODEPOOL_LABEL}={nodepool}" if nodepool else None, label_selector) if s]
        items = self.custom.list_cluster_custom_object(*KARPENTER, "nodeclaims",
                                                       label_selector=",".join(selectors))["items"]
        return sorted(items, key=lambda c: c["metadata"]["name"])

    def nodes(self, nodepool: str) -> list[Any]:
        return sorted(self.core.list_node(label_selector=f"{NODEPOOL_LABEL}={nodepool}").items,
                      key=lambda n: n.metadata.name)

    def node_of_claim(self, claim: str, timeout: float = 120) -> str:
        """Until the claim's Node exists (registered); its name."""
        def node() -> str | None:
            obj = self.custom.get_cluster_custom_object(*KARPENTER, "nodeclaims", claim)
            name = (obj.get("status") or {}).get("nodeName")
            return str(name) if name and _ignore_404(self.core.read_node, name) is not None else None

        return str(wait_until(node, timeout, interval=0.5, what=f"a Node for NodeClaim {claim}"))

    def give_gpus(self, node: str, pool: str, count: int = 1, vram: str = "80Gi", tflops: str = "312",
                  model: str = "A100") -> list[str]:
        """TensorFusion GPU objects for ``node``, as the TensorFusion node agent creates them."""
        names = []
        for i in range(count):
            name = f"{node}-gpu-{i}"
            create_gpu(self.api_client, name, node, pool=pool, vram=vram, tflops=tflops, model=model,
                           index=i)
            self._gpus.append(name)
            names.append(name)
        return names

    # -- cleanup ------------------------------------------------------------------------------------

    def reset(self, timeout: float = 90) -> None:
        """Delete the NodePools made here and every NodeClaim of them, and wait until their nodes are gone
        (finalizers stripped when Karpenter cannot finish within ``timeout``, e.g. pods it will not evict)."""
        pools, self._nodepools = list(self._nodepools), []
        claims = [c["metadata"]["name"] for c in self.claims()
                  if (c["metadata"].get("labels") or {}).get(NODEPOOL_LABEL) in pools]
        for name in pools:
            _ignore_404(self.custom.delete_cluster_custom_object, *KARPENTER, "nodepools", name)
        for name in claims:
            _ignore_404(self.custom.delete_cluster_custom_object, *KARPENTER, "nodeclaims", name)

        def gone() -> bool:
            left = {c["metadata"]["name"] for c in self.claims()} & set(claims)
            nodes = [n for p in pools for n in self.nodes(p)]
            return not left and not nodes

        try:
            wait_until(gone, timeout, interval=1, what="Karpenter to remove the test's NodeClaims")
        except TimeoutError:
            self._force_remove(pools, claims)
        for gpu in self._gpus:
            _ignore_404(self.custom.delete_cluster_custom_object, TF_GROUP, TF_VERSION, "gpus", gpu)
        self._gpus = []

    def _force_remove(self, pools: list[str], claims: list[str]) -> None:
        for name in claims:
            _ignore_404(self.custom.patch_cluster_custom_object, *KARPENTER, "nodeclaims", name,
                        {"metadata": {"finalizers": None}})
        for pool in pools:
            for node in self.nodes(pool):
                _ignore_404(self.core.patch_node, node.metadata.name, {"metadata": {"finalizers": None}})
                _ignore_404(self.core.delete_node, node.metadata.name)
        for name in pools:
            _ignore_404(self.custom.patch_cluster_custom_object, *KARPENTER, "nodepools", name,
                        {"metadata": {"finalizers": None}})

    def close(self) -> None:
        """reset(), then stop Karpenter and delete the NodeClasses and the overlay."""
        try:
            self.reset()
        finally:
            self.stop()
            for name in self._nodeclasses:
                with contextlib.suppress(ApiException):
                    self.custom.patch_cluster_custom_object(*KWOK_NODECLASS, "kwoknodeclasses", name,
                                                            {"metadata": {"finalizers": None}})
                    self.custom.delete_cluster_custom_object(*KWOK_NODECLASS, "kwoknodeclasses", name)
            if self.settings.node_overlay:
                with contextlib.suppress(ApiException):
                    self.custom.delete_cluster_custom_object(
                        *OVERLAY, "nodeoverlays", load_yaml_docs(OVERLAY_MANIFEST)[0]["metadata"]["name"])


def start_karpenter(cp: ControlPlane, api_client: Any, binaries: dict[str, Path],
                    settings: KarpenterSettings | None = None) -> Karpenter:
    return Karpenter(cp, api_client, binaries["karpenter"], binaries["karpenter-crds"],
                     settings or KarpenterSettings()).start()


def karpenter_fixture(**settings: Any) -> Any:
    """A module-scoped fixture ``karpenter``: the real Karpenter with these ``KarpenterSettings``, running
    for the module's tests (assign it to a module-level name ``karpenter``)."""
    parsed = KarpenterSettings(**settings)

    @pytest.fixture(scope="module")
    def karpenter(cluster: ControlPlane, api_client: Any,
                  e2e_binaries: dict[str, Path]) -> Iterator[Karpenter]:
        k = start_karpenter(cluster, api_client, e2e_binaries, parsed)
        try:
            yield k
        finally:
            k.close()

    return karpenter
