"""The API resources the project reads and writes, and their REST paths."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


PODS = Resource("", "v1", "pods", "Pod", True)
NODES = Resource("", "v1", "nodes", "Node", False)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", True)
EVENTS = Resource("", "v1", "events", "Event", True)
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet", True)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", True)
JOBS = Resource("batch", "v1", "jobs", "Job", True)
CRONJOBS = Resource("batch", "v1", "cronjobs", "CronJob", True)
# Kubernetes 1.36's gang API (feature gate GenericWorkload); absent on API servers without it
POD_GROUPS = Resource("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup", True)
GPUS = Resource("tensor-fusion.ai", "v1", "gpus", "GPU", False)
GPU_POOLS = Resource("tensor-fusion.ai", "v1", "gpupools", "GPUPool", False)
SCHEDULING_CONFIG_TEMPLATES = Resource(
    "tensor-fusion.ai", "v1", "schedulingconfigtemplates", "SchedulingConfigTemplate", False
)
WORKLOAD_PROFILES = Resource("tensor-fusion.ai", "v1", "workloadprofiles", "WorkloadProfile", True)
GPU_RESOURCE_QUOTAS = Resource("tensor-fusion.ai", "v1", "gpuresourcequotas", "GPUResourceQuota", True)
TENSOR_FUSION_WORKLOADS = Resource("tensor-fusion.ai", "v1", "tensorfusionworkloads", "TensorFusionWorkload",
                                  True)
GPU_NODE_CLAIMS = Resource("tensor-fusion.ai", "v1", "gpunodeclaims", "GPUNodeClaim", False)
GPU_NODE_CLASSES = Resource("tensor-fusion.ai", "v1", "gpunodeclasses", "GPUNodeClass", False)
GPU_NODES = Resource("tensor-fusion.ai", "v1", "gpunodes", "GPUNode", False)
TENSOR_FUSION_CLUSTERS = Resource(
    "tensor-fusion.ai", "v1", "tensorfusionclusters", "TensorFusionCluster", False)
GPU_RESOURCE_QUOTAS = Resource("tensor-fusion.ai", "v1", "gpuresourcequotas", "GPUResourceQuota", True)
NODECLAIMS = Resource("karpenter.sh", "v1", "nodeclaims", "NodeClaim", False)
NODEPOOLS = Resource("karpenter.sh", "v1", "nodepools", "NodePool", False)
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)


def collection_path(resource: Resource, namespace: str | None = None) -> str:
    """``/api/v1/pods``, ``/api/v1/namespaces/ns/pods``, ``/apis/group/version/plural`` ...

    A namespaced resource without a namespace gives the all-namespaces collection; a cluster-scoped
    resource ignores the namespace.
    """
    root = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
    if resource.namespaced and namespace:
        return f"{root}/namespaces/{_segment(namespace)}/{resource.plural}"
    return f"{root}/{resource.plural}"


def object_path(resource: Resource, name: str, namespace: str | None = None,
                subresource: str | None = None) -> str:
    if resource.namespaced and not namespace:
        raise ValueError(f"{resource.kind} {name!r} needs a namespace")
    path = f"{collection_path(resource, namespace)}/{_segment(name)}"
    return f"{path}/{_segment(subresource)}" if subresource else path


def _segment(value: str) -> str:
    if not value or value in (".", ".."):
        raise ValueError(f"{value!r} is not a valid path segment")
    return quote(value, safe="")
