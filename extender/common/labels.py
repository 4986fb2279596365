"""Every well-known label, annotation and taint key the project reads or writes, each defined once.

The keys of the pod contract (DESIGN §3: what a user or the webhook writes on a GPU pod, and what the bind
writes back) live in :mod:`extender.common.contract`, beside their parsing; it builds them with :func:`key`
from the :data:`DOMAIN` below. This module holds all the others: ours on Nodes, pools, claims and helper pods,
Karpenter's, and the Kubernetes and NVIDIA labels the code relies on. Where a key is TensorFusion's own, the
comment names TensorFusion's constant (``internal/constants/constants.go``); the values must not change, or
objects written by an earlier release (or by TensorFusion) would no longer be recognised.
"""

from __future__ import annotations

DOMAIN = "tensor-fusion.ai"  # TensorFusion: Domain


def key(name: str) -> str:
    """``tensor-fusion.ai/<name>``."""
    return f"{DOMAIN}/{name}"


# --- ours: Nodes --------------------------------------------------------------------------------------------
# Written on a Node whose GPUs got room, so kube-scheduler retries the GPU pods it parked.
NUDGE_ANNOTATION = key("gpu-room-seen")
# A node compaction is removing (TensorFusion: NodeDeletionMark).
SHOULD_DELETE = key("should-delete")
# Marks a karpenter.sh/do-not-disrupt that compaction set, so it never takes away one a user set.
PROTECTED_BY = key("protected-by-compaction")
# A node or pod neither compaction nor defragmentation may move (TensorFusion: SchedulingDoNotDisruptLabel).
SCHEDULING_DO_NOT_DISRUPT = key("do-not-disrupt")
# "true" on a node (or a NodePool's template) that carries GPUs: what the shipped NodeOverlay selects.
GPU_NODE_LABEL = key("gpu-node")

# --- ours: GPUPools -----------------------------------------------------------------------------------------
# Which provisioner grows the pool, overriding TF_NODE_PROVISIONER (TensorFusion: ProvisionerLabelKey).
# The same key on a Node names the GPUNodeClaim it joins (Provisioned mode: the VM's user data sets it).
NODE_PROVISIONER = key("node-provisioner")
# An RFC 3339 time: compact the pool now (TensorFusion: TensorFusionPoolManualCompaction).
MANUAL_COMPACTION = key("manual-compaction")
# An RFC 3339 time: defragment the pool now.
MANUAL_DEFRAG = key("manual-defrag")
# The Karpenter NodePool and instance type a pool's expansions use, when not taken from a template node.
EXPANSION_NODEPOOL = key("expansion-nodepool")
EXPANSION_INSTANCE_TYPE = key("expansion-instance-type")

# --- TensorFusion's object model: TensorFusionCluster -> GPUPool, GPUPool -> GPUNodeClaim and GPUNode ------
# The owner of a derived object: on a GPUPool the TensorFusionCluster's name, on a GPUNodeClaim or GPUNode
# the GPUPool's (TensorFusion: LabelKeyOwner).
MANAGED_BY = key("managed-by")
# On a GPUNode: ``tensor-fusion.ai/pool-<pool>: "true"`` for each pool it serves
# (TensorFusion: GPUNodePoolIdentifierLabelPrefix).
POOL_IDENTIFIER_PREFIX = key("pool-")
# Ours, on a GPUPool derived from a TensorFusionCluster: a hash of the specTemplate it was last written
# from, so a pool edited by hand is told apart from a template that changed (TensorFusion keeps no such mark).
TEMPLATE_HASH = key("template-hash")

# --- ours: NodeClaims and GPUNodeClaims ---------------------------------------------------------------------
EXPANSION_LABEL = key("expansion")
EXPANSION_POD_UID_LABEL = key("expansion-pod-uid")
EXPANSION_POD_ANNOTATION = key("expansion-pod")
EXPANSION_TEMPLATE_NODE = key("expansion-template-node")
GPU_NODE_CLAIM_LABEL = key("gpu-node-claim")
HOURLY_PRICING = key("hourly-pricing")  # TensorFusion: PricingAnnotation

# --- ours: the labels of Karpenter-mode instance types (a pool's gpuRequirements name them) -----------------
GPU_VENDOR = key("gpu-vendor")
GPU_INSTANCE_FAMILY = key("gpu-instance-family")
GPU_INSTANCE_SIZE = key("gpu-instance-size")

# --- ours: the VMs and volumes of Provisioned-mode pools (cloud tags) ---------------------------------------
# TensorFusion's three tags: "managed-by: tensor-fusion.ai", the claim's name and the GPUNodeClass.
CLOUD_MANAGED_BY = "managed-by"
CLOUD_TAG_NODE_NAME = key("node-name")
CLOUD_TAG_NODE_CLASS = key("node-class")
# The cluster (its TensorFusionCluster, or --cluster-name): what the orphan sweep selects on.
CLOUD_TAG_CLUSTER = key("cluster")
# On a GPUNodeClaim of a Provisioned pool: terminate the VM (and delete the Node) before the claim goes.
PROVISIONED_FINALIZER = key("provisioned-node")
# On a GPUNodeClaim of a Provisioned pool: the computingVendor its VM was bought through (JSON, no secrets:
# the type, region, endpoint and key file paths), so its VM is terminated even when its pool and the
# TensorFusionCluster are gone (a deleted cluster takes its pools, and they their claims).
COMPUTING_VENDOR = key("computing-vendor")

# --- ours: helper pods (Cluster Autoscaler placeholders, GPU reservations) ----------------------------------
PLACEHOLDER_LABEL = key("placeholder")
PLACEHOLDER_FOR = key("placeholder-for")  # annotation: namespace/name of the pending pod
PLACEHOLDER_FOR_UID = key("placeholder-for-uid")  # label: its uid
PLACEHOLDER_TEMPLATE = key("placeholder-template")  # annotation: the node it copies
RESERVATION_LABEL = key("gpu-reservation")
RESERVED_GPU = key("reserved-gpu")  # annotation: the GPU's name

# --- Karpenter (karpenter.sh, pkg/apis/v1/labels.go) --------------------------------------------------------
KARPENTER_GROUP = "karpenter.sh"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"  # DoNotDisruptAnnotationKey
NODEPOOL_LABEL = "karpenter.sh/nodepool"  # NodePoolLabelKey
NODEPOOL_HASH = "karpenter.sh/nodepool-hash"  # NodePoolHashAnnotationKey
NODEPOOL_HASH_VERSION = "karpenter.sh/nodepool-hash-version"  # NodePoolHashVersionAnnotationKey
CAPACITY_TYPE = "karpenter.sh/capacity-type"  # CapacityTypeLabelKey
UNREGISTERED_TAINT = "karpenter.sh/unregistered"  # UnregisteredTaintKey

# --- Kubernetes well-known labels ---------------------------------------------------------------------------
HOSTNAME = "kubernetes.io/hostname"
ARCH = "kubernetes.io/arch"
OS = "kubernetes.io/os"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"

# --- NVIDIA: the device plugin's resource, GPU Feature Discovery's node labels ------------------------------
NVIDIA_GPU = "nvidia.com/gpu"
AMD_GPU = "amd.com/gpu"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB

# --- Kubernetes and Cluster Autoscaler annotations on helper pods -------------------------------------------
APP_MANAGED_BY = "app.kubernetes.io/managed-by"
# --- who installed a CustomResourceDefinition (tf-extender crds): ours carry APP_PART_OF; Helm marks what a
# release's templates made; controller-gen (TensorFusion's CRDs) marks what it generated
APP_PART_OF = "app.kubernetes.io/part-of"
HELM_CHART = "helm.sh/chart"
HELM_RELEASE_NAME = "meta.helm.sh/release-name"
HELM_RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"
CONTROLLER_GEN_VERSION = "controller-gen.kubebuilder.io/version"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
