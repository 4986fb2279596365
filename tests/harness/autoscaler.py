"""The real Cluster Autoscaler (kwok cloud provider) and a plain default scheduler, for the end-to-end tests.

The Go module proxy refuses every Cluster Autoscaler module, so the binary cannot be built here: the tests
that need it run when ``TF_CLUSTER_AUTOSCALER`` names a ``cluster-autoscaler`` binary built with
``-tags kwok`` (or its ``.xz``, unpacked once into the binary cache). Without it they are skipped, and the
session ends with one line saying so (``NOT_RUN``).

The kwok provider reads its node groups from two ConfigMaps in the namespace given by ``POD_NAMESPACE``:
``kwok-provider-config`` (where the groups come from, the GPU label) and ``kwok-provider-templates`` (a
``v1 List`` of template Nodes with min/max annotations, taints and allocatable). Nodes it creates carry
``kwok.x-k8s.io/node: fake``, so the session's kwok plays their kubelet.
"""

from __future__ import annotations

import fcntl
import lzma
import os
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from .components import start_scheduler
from .controlplane import ControlPlane
from .manifests import MANIFESTS, create_or_replace
from .processes import ManagedProcess, free_port, wait_until

ENV_BINARY = "TF_CLUSTER_AUTOSCALER"
VERSION = "v1.36"
NOT_RUN = (f"Cluster Autoscaler end-to-end tests did not run: set {ENV_BINARY} to a cluster-autoscaler "
           "binary built with -tags kwok, or its .xz (CI sets it to its own copy)")

HINTS = MANIFESTS / "optional" / "cluster-autoscaler" / "node-template-hints.yaml"
MIN_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/min-count"
MAX_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/max-count"
POOL_LABEL = "tensor-fusion.ai/gpupool"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

# The README's verified flags: short scan and scale-down timers so a scenario takes about a minute.
FLAGS = (
    "--cloud-provider=kwok", "--leader-elect=false", "--scan-interval=5s", "--new-pod-scale-up-delay=0s",
    "--max-node-provision-time=2m", "--scale-down-unneeded-time=15s", "--scale-down-delay-after-add=15s",
    "--scale-down-delay-after-delete=0s", "--scale-down-delay-after-failure=5s",
    "--skip-nodes-with-local-storage=false", "--skip-nodes-with-system-pods=false", "--expander=random",
    # A node found unremovable is not looked at again for 5 minutes by default; re-check every scan, so that
    # what keeps a node (or lets it go) is seen within seconds.
    "--unremovable-node-recheck-timeout=5s",
)


def cache_dir() -> Path:
    return Path(os.environ.get("TF_CACHE_DIR") or Path.home() / ".cache" / "tensor-fusion-extender")


def source() -> Path | None:
    """The file ``TF_CLUSTER_AUTOSCALER`` names (a binary or its ``.xz``); None when the variable is unset or
    names nothing. Cheap: what decides at collection whether the tests run."""
    raw = os.environ.get(ENV_BINARY, "").strip()
    return Path(raw) if raw and Path(raw).is_file() else None


def binary() -> Path | None:
    """The Cluster Autoscaler binary named by ``TF_CLUSTER_AUTOSCALER``, unpacked into the binary cache when
    it is an ``.xz`` (only when a test needs it, so a run that selects none unpacks nothing); None when the
    variable is unset or names nothing."""
    given = source()
    if given is None or given.suffix != ".xz":
        return given
    target = cache_dir() / "bin" / f"cluster-autoscaler-{VERSION}" / "cluster-autoscaler"
    target.parent.mkdir(parents=True, exist_ok=True)
    # two runs (or workers) may ask at once: one unpacks, the others wait and reuse it
    with (target.parent / ".unpack.lock").open("ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists() or target.stat().st_mtime < given.stat().st_mtime:
            partial = target.with_name(f"{target.name}.partial.{os.getpid()}")
            with lzma.open(given) as packed, partial.open("wb") as out:
                shutil.copyfileobj(packed, out, 1 << 20)
            partial.chmod(0o755)
            partial.replace(target)
    return target


def index_allocatable() -> dict[str, str]:
    """The index resources a kwok template node declares, from the shipped hints (the same data users get)."""
    hints = yaml.safe_load(HINTS.read_text())
    return {str(k): str(v) for k, v in hints["providers"]["kwok"]["allocatable"].items()}


def gpu_template(group_label: str, group: str, pool: str, *, gpu_label: str, gpu_type: str,
                 min_count: int = 0, max_count: int = 5, gpus: int = 1) -> dict[str, Any]:
    """A template Node of a tainted GPU node group: A100 80GB GPUs described by GPU Feature Discovery labels
    (the extender's node-label inventory), the pool label, and the index resources from the hints."""
    labels = {
        group_label: group, gpu_label: gpu_type, POOL_LABEL: pool,
        "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
    }
    allocatable = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": str(gpus),
                   **index_allocatable()}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": f"template-{group}", "labels": labels,
                     "annotations": {MIN_ANNOTATION: str(min_count), MAX_ANNOTATION: str(max_count)}},
        "spec": {"taints": [GPU_TAINT]},
        "status": {"capacity": dict(allocatable), "allocatable": dict(allocatable),
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }


def write_provider_config(api_client: Any, namespace: str, group_label: str, gpu_label: str, gpu_type: str,
                          templates: list[dict[str, Any]]) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    config = {"apiVersion": "v1alpha1", "readNodesFrom": "configmap",
              "nodegroups": {"fromNodeLabelKey": group_label},
              "nodes": {"skipTaint": True, "gpuConfig": {"gpuLabelKey": gpu_label,
                                                          "availableGPUTypes": {gpu_type: {}}}},
              "configmap": {"name": "kwok-provider-templates"}}
    for name, key, value in (
        ("kwok-provider-config", "config", yaml.safe_dump(config)),
        ("kwok-provider-templates", "templates", yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                                                 "items": templates})),
    ):
        create_or_replace(
            lambda body: core.create_namespaced_config_map(namespace, body),
            lambda n: core.read_namespaced_config_map(n, namespace),
            lambda n, body: core.replace_namespaced_config_map(n, namespace, body),
            {"metadata": {"name": name, "namespace": namespace}, "data": {key: value}})


def start_cluster_autoscaler(cp: ControlPlane, path: Path, namespace: str,
                             timeout: float = 90) -> ManagedProcess:
    """The Cluster Autoscaler with the README's flags, its kwok provider reading ``namespace``."""
    port = free_port()
    proc = cp.registry.start(
        "cluster-autoscaler",
        [str(path), f"--kubeconfig={cp.kubeconfig}", f"--address=127.0.0.1:{port}", *FLAGS, "--v=2"],
        cp.log_dir,
        # the kwok provider builds its own client from KUBECONFIG
        env={"POD_NAMESPACE": namespace, "KWOK_PROVIDER_MODE": "local", "KUBECONFIG": str(cp.kubeconfig),
             "HOME": str(cp.workdir)},
    )

    def healthy() -> bool:
        proc.check_alive()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health-check", timeout=2) as r:
            return r.status == 200

    wait_until(healthy, timeout, interval=0.5, what="cluster-autoscaler /health-check")
    proc.port = port  # type: ignore[attr-defined]
    return proc


def start_default_scheduler(cp: ControlPlane, path: Path) -> ManagedProcess:
    """A plain kube-scheduler serving ``default-scheduler`` (what every cluster runs; placeholders use it)."""
    config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
              "clientConnection": {"kubeconfig": str(cp.kubeconfig)},
              "leaderElection": {"leaderElect": False},
              "profiles": [{"schedulerName": "default-scheduler"}]}
    return start_scheduler(cp, path, "", name="default-scheduler", config=config)
