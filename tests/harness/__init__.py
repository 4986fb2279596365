"""The end-to-end harness: a real, local Kubernetes control plane and the project's services on it.

etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok, Karpenter and helm are built from the
Go module proxy by ``build-control-plane.sh`` (cached outside the repository) and run on loopback, each in
its own process group with its log in ``<workdir>/logs/<name>.log``. One module per concept:

- ``processes``     ManagedProcess, the process registry, free ports, waiting (``wait_until``)
- ``build``         the binaries (``build_binaries``)
- ``pki``           CAs and leaf certificates
- ``manifests``     CRDs, kustomize rendering, the shipped scheduler and webhook configurations
- ``controlplane``  etcd + kube-apiserver (``ControlPlane``) and the identities tests act as
- ``components``    kube-scheduler, kube-controller-manager, kwok, tf-webhook, tf-extender runners
- ``objects``       Node, GPU and pod builders and waiters
- ``workloads``     Deployments, Jobs, PodDisruptionBudgets of GPU pods
- ``replicas``      two or more kube-scheduler + tf-extender pairs as the chart runs them, each behind a TCP
                    proxy to the API server that a test can cut (failover, rolling updates, partitions)
- ``karpenter``     the real Karpenter (KWOK provider) per test module
- ``autoscaler``    the real Cluster Autoscaler (kwok provider), when a binary is given
- ``expansion``     what the node-expansion test modules share (fixtures, a test's own NodePool)
- ``starve``        CPU starvation of the API server, for tests and benchmarks of the bind path under load
- ``cloud``         AWS EC2: moto's server, a capacity-refusing proxy, the world a GPUNodeClass selects from,
                    the EC2 CloudInit, vendor file and GPUNodeClass the Provisioned-mode modules share
- ``ecs``           Alibaba Cloud ECS: a local stand-in of its RPC API that checks the SDK's signature
- ``provisioned``   what the Provisioned-mode modules share: a cloud-init stand-in, a pool and its teardown
- ``prometheus``    a real Prometheus, for the usage tests
- ``image``         the container image, built with buildah and run with podman
- ``helm``          the chart: helm, renders, and a release run without kubelets
- ``promql``        the PromQL of the shipped alerts and dashboard, and the metric names it reads

This package re-exports the first seven modules' names, so a test module reads ``from tests import harness``
(conventionally ``as cpl``) and a program such as the demo or the benchmarks imports the same things. The
pytest fixtures that wire it together live in ``tests/e2e/conftest.py``.
"""

from __future__ import annotations

from .build import (
    BUILD_SCRIPT,
    KUBE_VERSION,
    build_binaries,
)
from .components import (
    CONTROLLERS,
    WEBHOOK_CONFIG_NAME,
    ExtenderRunner,
    WebhookServer,
    install_admission_policies,
    start_controller_manager,
    start_kwok,
    start_scheduler,
    start_webhook,
    stop_webhook,
)
from .controlplane import (
    EXTENDER_USER,
    PROJECT_NAMESPACE,
    ControlPlane,
    as_extender,
)
from .manifests import (
    ADMISSION_POLICY,
    CRDS_DIR,
    MANIFESTS,
    REPO_ROOT,
    SCHEDULER_CONFIG,
    apply_crds,
    create_or_replace,
    karpenter_crd_files,
    load_yaml_docs,
    project_crd_files,
    render_kustomization,
    scheduler_config,
    webhook_configuration,
)
from .objects import (
    DEFAULT_INDEX_CAPACITY,
    DEFAULT_POOL_ANNOTATION,
    ENABLED_LABEL,
    GPU_IDS_ANNOTATION,
    GPU_SCHEDULER_NAME,
    INDEX_RESOURCES,
    KWOK_NODE_ANNOTATION,
    TF_GROUP,
    TF_VERSION,
    b64,
    bind_pod,
    create_cluster_object,
    create_gpu,
    create_node,
    create_pod,
    gpu_body,
    gpu_ids_of,
    gpu_pod_body,
    node_body,
    object_events,
    place_by_hand,
    placed_pod_body,
    placement,
    pod_events,
    read_pod,
    scheduling_failure,
    wait_for_pod_bound,
    wait_for_pod_gone,
    wait_for_pod_running,
    wait_for_webhook_pool,
    which,
)
from .pki import (
    CertPair,
    make_ca,
    make_leaf,
    make_service_account_key,
)
from .processes import (
    PORT_LOCK_DIR,
    PORT_RANGE,
    PROCESSES,
    TIMEOUT_SCALE,
    ManagedProcess,
    ProcessRegistry,
    console_script,
    free_port,
    http_ready,
    https_ready,
    run_console_script,
    tail,
    wait_until,
)

__all__ = [
    "ADMISSION_POLICY",
    "BUILD_SCRIPT",
    "CONTROLLERS",
    "CRDS_DIR",
    "DEFAULT_INDEX_CAPACITY",
    "DEFAULT_POOL_ANNOTATION",
    "ENABLED_LABEL",
    "EXTENDER_USER",
    "GPU_IDS_ANNOTATION",
    "GPU_SCHEDULER_NAME",
    "INDEX_RESOURCES",
    "KUBE_VERSION",
    "KWOK_NODE_ANNOTATION",
    "MANIFESTS",
    "PORT_LOCK_DIR",
    "PORT_RANGE",
    "PROCESSES",
    "PROJECT_NAMESPACE",
    "REPO_ROOT",
    "SCHEDULER_CONFIG",
    "TF_GROUP",
    "TF_VERSION",
    "TIMEOUT_SCALE",
    "WEBHOOK_CONFIG_NAME",
    "CertPair",
    "ControlPlane",
    "ExtenderRunner",
    "ManagedProcess",
    "ProcessRegistry",
    "WebhookServer",
    "apply_crds",
    "as_extender",
    "b64",
    "bind_pod",
    "build_binaries",
    "console_script",
    "create_cluster_object",
    "create_gpu",
    "create_node",
    "create_or_replace",
    "create_pod",
    "free_port",
    "gpu_body",
    "gpu_ids_of",
    "gpu_pod_body",
    "http_ready",
    "https_ready",
    "install_admission_policies",
    "karpenter_crd_files",
    "load_yaml_docs",
    "make_ca",
    "make_leaf",
    "make_service_account_key",
    "node_body",
    "object_events",
    "place_by_hand",
    "placed_pod_body",
    "placement",
    "pod_events",
    "project_crd_files",
    "read_pod",
    "render_kustomization",
    "run_console_script",
    "scheduler_config",
    "scheduling_failure",
    "start_controller_manager",
    "start_kwok",
    "start_scheduler",
    "start_webhook",
    "stop_webhook",
    "tail",
    "wait_for_pod_bound",
    "wait_for_pod_gone",
    "wait_for_pod_running",
    "wait_for_webhook_pool",
    "wait_until",
    "webhook_configuration",
    "which",
]
