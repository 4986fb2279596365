"""TensorFusion's guides as an acceptance test: each step a user runs with kubectl, as the API call kubectl
makes, with the guides' YAML applied as written, on the real control plane with the real Karpenter.

The guides: "Bring Your Own Cloud" (Karpenter mode: pool settings on the TensorFusionCluster, the cloud
vendor's condition, GPUNodeClaims becoming NodeClaims and nodes, ``kubectl get gpunode``), "Optimize GPU
Efficiency" (placement through ``tf-scheduling-config``, pool settings on the cluster's template,
autoscaling recommendations) and its Provisioned-mode variant (a GPUNodeClass and a cloud vendor of type
``aws``). docs/tensorfusion-compatibility.md lists every step and what this project answers to it.

Local substitutes, where this control plane cannot have the real thing, each marked ``SUBSTITUTE``:

- the guide's EC2NodeClass is the KWOKNodeClass ``default`` of Karpenter's KWOK provider (the only
  NodeClass kind a local Karpenter has); nothing else of the guide's YAML changes;
- the KWOK provider's instance types carry the guide's AWS names (``g6.xlarge``: one L4), and the extender's
  instance catalog is a ConfigMap listing exactly those at the same price (AWS's price list is not reachable);
- the chart's default objects are applied from manifests/defaults/ and manifests/optional/ (the kustomize
  equivalent; tests/e2e/test_helm_chart.py installs the chart itself, its ``lookup`` included).

Provisioned mode through Alibaba Cloud runs against a local stand-in of ECS (``SUBSTITUTE``, no emulator of
it exists): the cluster's ``CloudVendorConnectionReady`` follows the SDK's calls to it. Autoscaling: a fresh
workload's ``ResourceUpdate`` condition says why it has no recommendation yet
(tests/e2e/test_autoscale_e2e.py follows the recommendations that come after).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl
from tests.e2e.test_capacity_e2e import Claims
from tests.harness import ecs
from tests.harness.karpenter import InstanceType, Karpenter, karpenter_fixture

pytestmark = pytest.mark.e2e

# SUBSTITUTE: the guide's AWS instance type, offered by Karpenter's KWOK provider under the same name.
L4_TFLOPS = 121  # one L4 in the extender's GPU model table
INSTANCE_TYPES = (
    InstanceType("g6.xlarge", gpus=1, gpu_product="NVIDIA-L4", gpu_memory_mib=23034, cpu="4", memory="16Gi",
                 price=0.8048, zones=("zone-a",)),
)
karpenter = karpenter_fixture(node_overlay=True, instance_types=INSTANCE_TYPES)

CATALOG_CONFIGMAP = "tf-e2e-guides-catalog"
CATALOG = {"replaceDefaults": True, "instanceTypes": [
    {"name": "g6.xlarge", "gpuModel": "L4", "gpuCount": 1, "vramPerGPU": "24Gi",
     "prices": {"on-demand": 0.8048}}]}

TF = (cpl.TF_GROUP, cpl.TF_VERSION)
KARPENTER_API = ("karpenter.sh", "v1")
OVERLAY_API = ("karpenter.sh", "v1alpha1")
CLUSTER = "tensor-fusion"
POOL = "tensor-fusion-shared"  # the GPUPool derived from the cluster's pool "shared": <cluster>-<pool>
MANAGED_BY = "tensor-fusion.ai/managed-by"
POOL_LABEL = "tensor-fusion.ai/gpupool"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
NO_FINALIZERS: dict[str, Any] = {"metadata": {"finalizers": None}}
GUIDE_NODE_LABELS = {"tensor-fusion.ai/node-role": "gpu-worker", "team": "inference"}

# "Bring Your Own Cloud", Karpenter mode: the TensorFusionCluster, as the guide writes it.
GUIDE_CLUSTER = yaml.safe_load("""
apiVersion: tensor-fusion.ai/v1
kind: TensorFusionCluster
metadata:
  name: tensor-fusion
spec:
  computingVendor:
    name: karpenter
    type: karpenter
    authType: serviceAccountRole
    enable: true
    params:
      defaultRegion: us-east-1
  gpuPools:
  - name: shared
    isDefault: true
    specTemplate:
      capacityConfig:
        minResources:
          tflops: "200"
          vram: 40Gi
        maxResources:
          tflops: "1000"
          vram: 200Gi
      nodeManagerConfig:
        provisioningMode: Karpenter
        nodeCompaction:
          period: 5m
        nodeProvisioner:
          karpenterNodeClassRef:
            group: karpenter.k8s.aws
            kind: EC2NodeClass
            name: default
            version: v1
          gpuRequirements:
          - key: node.kubernetes.io/instance-type
            operator: In
            values: ["g6.xlarge"]
          - key: karpenter.sh/capacity-type
            operator: In
            values: ["on-demand"]
          gpuNodeLabels:
            tensor-fusion.ai/node-role: gpu-worker
            team: inference
      schedulingConfigTemplate: tf-scheduling-config
""")
# SUBSTITUTE: the EC2NodeClass reference becomes the local Karpenter's KWOKNodeClass "default".
GUIDE_CLUSTER["spec"]["gpuPools"][0]["specTemplate"]["nodeManagerConfig"]["nodeProvisioner"][
    "karpenterNodeClassRef"] = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default",
                                "version": "v1alpha1"}

# The Provisioned-mode variant: a GPUNodeClass and a cluster whose vendor is the cloud itself, here Alibaba
# Cloud (AWS is covered by tests/e2e/test_provisioned_e2e.py). Named
# "tensor-fusion-aws" here (the guide's is "tensor-fusion") so that it sits beside the Karpenter-mode one.
GUIDE_NODE_CLASS = yaml.safe_load("""
apiVersion: tensor-fusion.ai/v1
kind: GPUNodeClass
metadata:
  name: aws-gpu
spec:
  osImageSelectorTerms:
  - name: amazon-eks-node-al2023-x86_64-nvidia-*
    owner: amazon
  blockDeviceMappings:
  - deviceName: /dev/xvda
    ebs:
      volumeSize: 100Gi
      volumeType: gp3
  instanceProfile: KarpenterNodeInstanceProfile
  tags:
    team: inference
""")
GUIDE_PROVISIONED_CLUSTER = yaml.safe_load("""
apiVersion: tensor-fusion.ai/v1
kind: TensorFusionCluster
metadata:
  name: tensor-fusion-aws
spec:
  computingVendor:
    name: alibaba
    type: alibaba
    authType: accessKey
    enable: true
    params:
      defaultRegion: cn-hangzhou
      accessKeyPath: /tmp/ak
      secretKeyPath: /tmp/sk
  gpuPools:
  - name: provisioned
    specTemplate:
      capacityConfig:
        minResources:
          tflops: "100"
          vram: 24Gi
      nodeManagerConfig:
        provisioningMode: Provisioned
        nodeProvisioner:
          nodeClass: aws-gpu
          gpuRequirements:
          - key: node.kubernetes.io/instance-type
            operator: In
            values: ["g6.xlarge"]
      schedulingConfigTemplate: tf-scheduling-config
""")


# ------------------------------------------------------------------------------------------- helpers


def _custom(api_client: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def kubectl_apply(api_client: Any, plural: str, body: dict[str, Any], group_version: tuple[str, str] = TF,
                  namespace: str | None = None) -> None:
    """``kubectl apply -f``: create, or make the stored spec the file's (its metadata kept)."""
    custom = _custom(api_client)
    body = json.loads(json.dumps(body))
    name = body["metadata"]["name"]
    try:
        if namespace:
            custom.create_namespaced_custom_object(*group_version, namespace, plural, body)
        else:
            custom.create_cluster_custom_object(*group_version, plural, body)
        return
    except ApiException as exc:
        if exc.status != 409:
            raise
    patch = {"spec": body.get("spec")}
    if namespace:
        current = custom.get_namespaced_custom_object(*group_version, namespace, plural, name)
    else:
        current = custom.get_cluster_custom_object(*group_version, plural, name)
    current["spec"] = patch["spec"]
    if namespace:
        custom.replace_namespaced_custom_object(*group_version, namespace, plural, name, current)
    else:
        custom.replace_cluster_custom_object(*group_version, plural, name, current)


def kubectl_get(api_client: Any, plural: str, name: str,
                group_version: tuple[str, str] = TF) -> dict[str, Any]:
    return _custom(api_client).get_cluster_custom_object(*group_version, plural, name)


def get_or_none(api_client: Any, plural: str, name: str,
                group_version: tuple[str, str] = TF) -> dict[str, Any] | None:
    try:
        return kubectl_get(api_client, plural, name, group_version)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or []
                 if c.get("type") == kind), None)


def kubectl_get_table(api_client: Any, plural: str, group_version: tuple[str, str] = TF) -> dict[str, Any]:
    """What ``kubectl get <plural>`` prints: the server's Table (the CRD's printer columns)."""
    path = f"/apis/{group_version[0]}/{group_version[1]}/{plural}"
    table = "application/json;as=Table;v=v1;g=meta.k8s.io"
    request = api_client.param_serialize(method="GET", resource_path=path, auth_settings=["BearerToken"],
                                         header_params={"Accept": table})
    response = api_client.call_api(*request)
    response.read()
    return json.loads(response.data)


def table_rows(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [c["name"] for c in table["columnDefinitions"]]
    return {row["cells"][0]: dict(zip(names, row["cells"], strict=True)) for row in table["rows"]}


def pool_gpunodeclaims(api_client: Any, pool: str) -> list[dict[str, Any]]:
    """The pool's GPUNodeClaims, by TensorFusion's label (managed-by) or the earlier one (gpupool)."""
    items = _custom(api_client).list_cluster_custom_object(*TF, "gpunodeclaims")["items"]
    return sorted((c for c in items if pool in {(c["metadata"].get("labels") or {}).get(MANAGED_BY),
                                                 (c["metadata"].get("labels") or {}).get(POOL_LABEL)}),
                  key=lambda c: c["metadata"]["name"])


def bound(api_client: Any, pool: str, count: int) -> list[dict[str, Any]] | None:
    claims = pool_gpunodeclaims(api_client, pool)
    done = [c for c in claims if (c.get("status") or {}).get("phase") == "Bound"]
    return claims if len(done) == count == len(claims) else None


def stays(predicate: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(0.5)
    return True


def cluster_events(api_client: Any, name: str, reason: str | None = None) -> list[Any]:
    events = client.CoreV1Api(api_client).list_event_for_all_namespaces(
        field_selector=f"involvedObject.kind=TensorFusionCluster,involvedObject.name={name}").items
    return [e for e in events if reason is None or e.reason == reason]


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def catalog(api_client: Any, webhook: Any) -> Iterator[str]:
    # SUBSTITUTE: the guide's instance types at AWS's published price, as the extender's catalog.
    core = client.CoreV1Api(api_client)
    body = {"metadata": {"name": CATALOG_CONFIGMAP, "namespace": cpl.PROJECT_NAMESPACE},
            "data": {"catalog.yaml": yaml.safe_dump(CATALOG)}}
    with contextlib.suppress(ApiException):
        core.delete_namespaced_config_map(CATALOG_CONFIGMAP, cpl.PROJECT_NAMESPACE)
    core.create_namespaced_config_map(cpl.PROJECT_NAMESPACE, body)
    yield f"{cpl.PROJECT_NAMESPACE}/{CATALOG_CONFIGMAP}"
    with contextlib.suppress(ApiException):
        core.delete_namespaced_config_map(CATALOG_CONFIGMAP, cpl.PROJECT_NAMESPACE)


@pytest.fixture(scope="module")
def installed(cluster: Any, api_client: Any, webhook: Any, karpenter: Karpenter) -> Iterator[None]:
    """The chart's default objects on a cluster with Karpenter. The session's own default pool steps aside
    (the guide's pool is the default one) and comes back at the end."""
    custom = _custom(api_client)
    custom.patch_cluster_custom_object(*TF, "gpupools", webhook.default_pool,
                                       {"metadata": {"annotations": {cpl.DEFAULT_POOL_ANNOTATION: None}}})
    for obj in cpl.render_kustomization(cpl.MANIFESTS / "defaults"):
        plural = {"SchedulingConfigTemplate": "schedulingconfigtemplates",
                  "TensorFusionCluster": "tensorfusionclusters"}[obj["kind"]]
        kubectl_apply(api_client, plural, obj)
    try:
        yield
    finally:
        for name in (CLUSTER, GUIDE_PROVISIONED_CLUSTER["metadata"]["name"]):
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(*TF, "tensorfusionclusters", name)
        for plural, name in (("schedulingconfigtemplates", "tf-scheduling-config"),
                             ("gpunodeclasses", GUIDE_NODE_CLASS["metadata"]["name"])):
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(*TF, plural, name)
        _release_nodes(api_client, karpenter)
        default = {"metadata": {"annotations": {cpl.DEFAULT_POOL_ANNOTATION: "true"}}}
        custom.patch_cluster_custom_object(*TF, "gpupools", webhook.default_pool, default)
        cpl.wait_for_webhook_pool(api_client, webhook.default_pool)


def _release_nodes(api_client: Any, karpenter: Karpenter) -> None:
    """The derived pools go with their cluster (owner references), their GPUNodeClaims with the pools, the
    NodeClaims with those; strip finalizers only if Karpenter cannot finish."""
    custom = _custom(api_client)
    core = client.CoreV1Api(api_client)
    for pool in (POOL, "tensor-fusion-aws-provisioned"):
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(*TF, "gpupools", pool)
        for claim in pool_gpunodeclaims(api_client, pool):
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(*TF, "gpunodeclaims", claim["metadata"]["name"])
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(*KARPENTER_API, "nodeclaims", claim["metadata"]["name"])

    def gone() -> bool:
        return not core.list_node(label_selector=f"{POOL_LABEL}={POOL}").items and not [
            c for c in custom.list_cluster_custom_object(*KARPENTER_API, "nodeclaims")["items"]
            if (c["metadata"].get("labels") or {}).get(POOL_LABEL) == POOL]

    try:
        cpl.wait_until(gone, 90, interval=1, what="the guide's nodes released")
    except TimeoutError:
        for claim in custom.list_cluster_custom_object(*KARPENTER_API, "nodeclaims")["items"]:
            if (claim["metadata"].get("labels") or {}).get(POOL_LABEL) == POOL:
                with contextlib.suppress(ApiException):
                    name = claim["metadata"]["name"]
                    custom.patch_cluster_custom_object(*KARPENTER_API, "nodeclaims", name, NO_FINALIZERS)
        for node in core.list_node(label_selector=f"{POOL_LABEL}={POOL}").items:
            with contextlib.suppress(ApiException):
                core.patch_node(node.metadata.name, NO_FINALIZERS)
                core.delete_node(node.metadata.name)


@pytest.fixture(scope="module")
def extender(installed: None, extender_runner: cpl.ExtenderRunner, catalog: str) -> cpl.ExtenderRunner:
    """The extender as the chart runs it (its TensorFusionCluster and GPUNode controllers are on by
    default), reconciling Karpenter-mode pools every second, with a short node protection time, and with
    workload autoscaling on (``--autoscale``), as the guide's autoscaling step needs."""
    extender_runner.ensure(capacity_interval=1, node_protection_time=20, catalog_configmap=catalog,
                           gpu_node_interval=1, autoscale=True, autoscale_interval="1s",
                           tensorfusion_cluster_interval="1s", cloud_key_dir=tempfile.gettempdir(),
                           # the Provisioned guide's endpoint is the local ECS stand-in's
                           cloud_endpoint_allow="http://127.0.0.1")
    return extender_runner


@pytest.fixture(scope="module")
def claims(api_client: Any) -> Iterator[Claims]:
    """``kubectl get gpunodeclaim -w``: every phase each GPUNodeClaim goes through."""
    watcher = Claims(api_client)
    yield watcher
    watcher.stop()


@pytest.fixture(scope="module")
def karpenter_mode(api_client: Any, extender: cpl.ExtenderRunner, claims: Claims,
                   karpenter: Karpenter) -> list[dict[str, Any]]:
    """The guide's Karpenter-mode TensorFusionCluster applied, until its minimum capacity is Bound."""
    kubectl_apply(api_client, "tensorfusionclusters", GUIDE_CLUSTER)
    # 200 TFLOPS / 40Gi minimum, one L4 (121 TFLOPS, 24Gi) per g6.xlarge: two nodes
    return cpl.wait_until(lambda: bound(api_client, POOL, 2), 180, interval=0.5,
                          what="the guide's two Bound GPUNodeClaims")


# ---------------------------------------------------------------------- Bring Your Own Cloud: install


def test_install_creates_the_objects_the_guides_name(api_client, extender, karpenter):
    # kubectl get nodeoverlay tensor-fusion-overlay (installed on a cluster with Karpenter)
    overlay = kubectl_get(api_client, "nodeoverlays", "tensor-fusion-overlay", OVERLAY_API)
    assert sorted(overlay["spec"]["capacity"]) == [f"tensor-fusion.ai/index_{k:x}" for k in range(16)]
    assert overlay["spec"]["requirements"] == []  # every NodePool, the guide's included
    # kubectl get schedulingconfigtemplate tf-scheduling-config
    sct = kubectl_get(api_client, "schedulingconfigtemplates", "tf-scheduling-config")
    assert sct["spec"]["placement"]["mode"] == "NodeCompactGPULowLoad"
    # kubectl get tensorfusioncluster tensor-fusion: the chart's, with its default pool "shared"
    cluster = kubectl_get(api_client, "tensorfusionclusters", CLUSTER)
    assert [p["name"] for p in cluster["spec"]["gpuPools"]] == ["shared"]
    pool = cpl.wait_until(lambda: get_or_none(api_client, "gpupools", POOL), 60, interval=0.5,
                          what="the GPUPool derived from the chart's TensorFusionCluster")
    assert pool["metadata"]["labels"][MANAGED_BY] == CLUSTER
    assert pool["metadata"]["annotations"][cpl.DEFAULT_POOL_ANNOTATION] == "true"
    assert pool["spec"]["schedulingConfigTemplate"] == "tf-scheduling-config"


# ------------------------------------------------------------------ Bring Your Own Cloud: Karpenter mode


def test_karpenter_mode_cluster_as_written_launches_gpu_nodes(api_client, karpenter_mode, claims):
    custom = _custom(api_client)
    # kubectl get tensorfusioncluster tensor-fusion -o jsonpath='{.status.conditions}'
    def connected() -> dict[str, Any] | None:
        found = condition(kubectl_get(api_client, "tensorfusionclusters", CLUSTER),
                          "CloudVendorConnectionReady")
        return found if (found or {}).get("status") == "True" else None

    ready = cpl.wait_until(connected, 60, interval=0.5, what="CloudVendorConnectionReady True")
    assert ready["reason"] == "CloudVendorConnectionOK"

    # Pool settings go on the TensorFusionCluster's specTemplate; the derived GPUPool carries them.
    pool = kubectl_get(api_client, "gpupools", POOL)
    template = GUIDE_CLUSTER["spec"]["gpuPools"][0]["specTemplate"]
    assert pool["spec"]["nodeManagerConfig"]["provisioningMode"] == "Karpenter"
    assert pool["spec"]["capacityConfig"]["minResources"] == template["capacityConfig"]["minResources"]
    assert pool["metadata"]["ownerReferences"][0]["kind"] == "TensorFusionCluster"

    # kubectl get gpunodeclaim,nodeclaim,gpunode -w: a GPUNodeClaim, then a NodeClaim of the same name,
    # Pending -> Creating -> Bound
    tflops = vram = 0.0
    for claim in karpenter_mode:
        name = claim["metadata"]["name"]
        assert claims.phases[name] == ["Pending", "Creating", "Bound"], claims.phases[name]
        assert claim["metadata"]["labels"][MANAGED_BY] == POOL  # TensorFusion's claim-to-pool label
        nodeclaim = custom.get_cluster_custom_object(*KARPENTER_API, "nodeclaims", name)
        assert nodeclaim["metadata"]["ownerReferences"][0]["name"] == name
        assert nodeclaim["metadata"]["annotations"][DO_NOT_DISRUPT] == "true"
        node = client.CoreV1Api(api_client).read_node(claim["spec"]["nodeName"])
        for key, value in GUIDE_NODE_LABELS.items():  # the guide's gpuNodeLabels
            assert node.metadata.labels[key] == value, (key, node.metadata.labels)
        assert node.metadata.labels["node.kubernetes.io/instance-type"] == "g6.xlarge"
        tflops += float(claim["spec"]["tflopsOffered"])
        vram += cpl_quantity(claim["spec"]["vramOffered"])
    # minResources met: 200 TFLOPS and 40Gi
    assert tflops >= 200 and vram >= 40 * 2**30, (tflops, vram)
    assert stays(lambda: len(pool_gpunodeclaims(api_client, POOL)) == 2, 5)  # and nothing more is bought

    # kubectl get gpunode: total and available TFLOPS and VRAM of each node
    nodes = {c["spec"]["nodeName"] for c in karpenter_mode}

    def rows() -> dict[str, dict[str, Any]] | None:
        found = table_rows(kubectl_get_table(api_client, "gpunodes"))
        ours = {n: r for n, r in found.items() if n in nodes}
        return ours if len(ours) == len(nodes) and all(r["Available TFlops"] for r in ours.values()) else None

    printed = cpl.wait_until(rows, 60, interval=0.5, what="kubectl get gpunode to list the guide's nodes")
    for row in printed.values():
        assert (row["Phase"], row["Total TFlops"], row["Total VRAM"]) == ("Running", str(L4_TFLOPS), "24Gi")
        assert (row["Available TFlops"], row["Available VRAM"], row["GPU Count"]) == (
            str(L4_TFLOPS), "24Gi", 1)


def cpl_quantity(text: str) -> float:
    from extender.common.quantity import parse_quantity

    return float(parse_quantity(text).value)


# --------------------------------------------------------------------------- Optimize GPU Efficiency


def test_placement_follows_tf_scheduling_config_and_gpunode_shows_what_is_used(
        api_client, karpenter_mode, namespace):
    nodes = sorted(c["spec"]["nodeName"] for c in karpenter_mode)
    core = client.CoreV1Api(api_client)
    # Two fractional pods that name no pool go to the default pool, the guide's "shared", and
    # NodeCompactGPULowLoad (tf-scheduling-config) packs them onto one node.
    for name in ("chat-a", "chat-b"):
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body(name, tflops="30", vram="4Gi"))
    first = {cpl.wait_for_pod_bound(api_client, namespace, n, timeout=90).spec.node_name
             for n in ("chat-a", "chat-b")}
    assert len(first) == 1, first
    (packed,) = first
    pod = core.read_namespaced_pod("chat-a", namespace)
    assert pod.metadata.annotations[POOL_LABEL] == POOL

    # kubectl get gpunode: availability follows what the pods hold (121 - 2 x 30 TFLOPS, 24Gi - 2 x 4Gi)
    def available() -> tuple[str, str] | None:
        row = table_rows(kubectl_get_table(api_client, "gpunodes")).get(packed)
        got = (row["Available TFlops"], row["Available VRAM"]) if row else None
        return got if got == ("61", "16Gi") else None

    cpl.wait_until(available, 60, interval=0.5, what="GPUNode availability after two pods")

    # kubectl patch schedulingconfigtemplate tf-scheduling-config --type merge \
    #   -p '{"spec":{"placement":{"mode":"LowLoadFirst"}}}'
    _custom(api_client).patch_cluster_custom_object(*TF, "schedulingconfigtemplates", "tf-scheduling-config",
                                                    {"spec": {"placement": {"mode": "LowLoadFirst"}}})
    # The next pod goes to the idle node. (The extender learns the change through its watch; a pod
    # placed before it arrives is removed and placed again.)
    (idle,) = [n for n in nodes if n != packed]

    def spread() -> bool:
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("chat-c", tflops="30", vram="4Gi"))
        node = cpl.wait_for_pod_bound(api_client, namespace, "chat-c", timeout=90).spec.node_name
        if node == idle:
            return True
        core.delete_namespaced_pod("chat-c", namespace, grace_period_seconds=0)
        cpl.wait_for_pod_gone(api_client, namespace, "chat-c")
        return False

    cpl.wait_until(spread, 60, interval=1, what="a pod placed LowLoadFirst on the idle node")


def test_pool_settings_on_the_cluster_overwrite_the_derived_pool(api_client, karpenter_mode):
    custom = _custom(api_client)
    # Pool settings go on spec.gpuPools[].specTemplate (kubectl edit tensorfusioncluster tensor-fusion)
    cluster = kubectl_get(api_client, "tensorfusionclusters", CLUSTER)
    cluster["spec"]["gpuPools"][0]["specTemplate"]["nodeManagerConfig"]["nodeCompaction"]["period"] = "10m"
    custom.replace_cluster_custom_object(*TF, "tensorfusionclusters", CLUSTER, cluster)
    cpl.wait_until(lambda: kubectl_get(api_client, "gpupools", POOL)["spec"]["nodeManagerConfig"][
        "nodeCompaction"]["period"] == "10m", 60, interval=0.5, what="the derived pool updated")
    # "The controller overwrites the derived GPUPool from that template": a hand edit does not stay
    custom.patch_cluster_custom_object(*TF, "gpupools", POOL,
                                       {"spec": {"nodeManagerConfig": {"nodeCompaction": {"period": "1m"}}}})
    cpl.wait_until(lambda: kubectl_get(api_client, "gpupools", POOL)["spec"]["nodeManagerConfig"][
        "nodeCompaction"]["period"] == "10m", 60, interval=0.5, what="the hand edit overwritten")
    updated = cpl.wait_until(lambda: cluster_events(api_client, CLUSTER, "GPUPoolUpdated") or None, 30,
                             interval=0.5, what="an event for the template change")
    assert any(POOL in e.message for e in updated)
    overwritten = cpl.wait_until(lambda: cluster_events(api_client, CLUSTER, "GPUPoolOverwritten") or None,
                                 30, interval=0.5, what="an event saying the hand edit was overwritten")
    assert overwritten[0].type == "Warning" and "edited by hand" in overwritten[0].message, overwritten[0]


def test_autoscaling_says_why_there_is_no_recommendation_yet(api_client, karpenter_mode, namespace):
    # The guide turns autoscaling on for a workload (tensor-fusion.ai/autoscale: "true") and reads
    # kubectl get tensorfusionworkload <workload> -o jsonpath='{.status.recommendation}'. A fresh workload
    # gets none until its InitialDelayPeriod (TensorFusion's default 30m) has passed, and its ResourceUpdate
    # condition says so; docs/autoscaling.md covers the recommendations that follow.
    body = cpl.gpu_pod_body("chat-auto", tflops="10", vram="2Gi",
                            annotations={"tensor-fusion.ai/autoscale": "true"})
    cpl.create_pod(api_client, namespace, body)
    cpl.wait_for_pod_bound(api_client, namespace, "chat-auto", timeout=90)
    custom = _custom(api_client)

    def workload() -> dict[str, Any] | None:
        try:
            obj = custom.get_namespaced_custom_object(*TF, namespace, "tensorfusionworkloads", "chat-auto")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj if condition(obj, "ResourceUpdate") else None

    obj = cpl.wait_until(workload, 60, interval=0.5, what="the workload's TensorFusionWorkload and condition")
    assert obj["spec"]["autoScalingConfig"]["autoSetResources"]["enable"] is True
    cond = condition(obj, "ResourceUpdate")
    assert cond["reason"] == "LowConfidence" and "InitialDelayPeriod" in cond["message"], cond
    assert "recommendation" not in (obj.get("status") or {}) or not obj["status"]["recommendation"]


# ------------------------------------------------------------------- Provisioned mode through Alibaba Cloud


@pytest.fixture
def alibaba_cloud(tmp_path: Any) -> Iterator[tuple[ecs.ECSStandIn, dict[str, Any]]]:
    """SUBSTITUTE: Alibaba Cloud's ECS endpoint is the local stand-in of its RPC API (tests/harness/ecs.py:
    it checks the official SDK's signature and answers in ECS's shapes), set as the vendor's
    ``extraParams.endpoint``; the guide's key files at /tmp/ak and /tmp/sk are written under the test's own
    folder, as the chart's Secret mount would hold them."""
    (tmp_path / "ak").write_text(ecs.ACCESS_KEY)
    (tmp_path / "sk").write_text(ecs.SECRET_KEY)
    cluster = json.loads(json.dumps(GUIDE_PROVISIONED_CLUSTER))
    params = cluster["spec"]["computingVendor"]["params"]
    params.update(accessKeyPath=str(tmp_path / "ak"), secretKeyPath=str(tmp_path / "sk"))
    with ecs.serve() as standin:
        standin.seed()
        params["extraParams"] = {"endpoint": standin.url}
        yield standin, cluster


def test_provisioned_mode_through_alibaba_cloud_reports_the_connection(api_client, karpenter_mode,
                                                                       alibaba_cloud, tmp_path):
    standin, cluster = alibaba_cloud
    kubectl_apply(api_client, "gpunodeclasses", GUIDE_NODE_CLASS)
    kubectl_apply(api_client, "tensorfusionclusters", cluster)
    name = cluster["metadata"]["name"]

    def connection(status: str) -> dict[str, Any] | None:
        cond = condition(get_or_none(api_client, "tensorfusionclusters", name), "CloudVendorConnectionReady")
        return cond if cond and cond["status"] == status else None

    # kubectl get tensorfusioncluster tensor-fusion -o jsonpath='{.status.conditions}'
    cond = cpl.wait_until(lambda: connection("True"), 60, interval=0.5,
                          what="the Provisioned-mode cluster's CloudVendorConnectionReady True")
    assert cond["reason"] == "CloudVendorConnectionOK"
    assert "computingVendor.type alibaba" in cond["message"] and "cn-hangzhou" in cond["message"]
    assert any(action == "DescribeRegions" for action, _ in standin.requests), "the check called ECS"
    # a rotated secret that is wrong: the condition turns False with ECS's own words, no crash
    (tmp_path / "sk").write_text("not-the-secret")
    cond = cpl.wait_until(lambda: connection("False"), 30, interval=0.5,
                          what="CloudVendorConnectionReady False after a wrong secret")
    assert "SignatureDoesNotMatch" in cond["message"], cond
