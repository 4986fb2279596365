"""The manifests a cluster admin applies, checked against the real API server:

- every object kustomize renders from manifests/ (and manifests/optional/, manifests/defaults/) passes a
  server-side apply dry run (dryRun=All);
- the project's CRDs are a compatible subset of TensorFusion's: the project's maximal example object per kind
  (tests/compat/tensor-fusion/, written from TensorFusion's published field list) is stored unchanged, and
  the minimal one is defaulted as TensorFusion's own CRD defaults it, in the fields this project reads.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from tests import harness as cpl

pytestmark = pytest.mark.e2e

PROJECT_NS = "tensor-fusion-sys"


@pytest.fixture(scope="module")
def dyn(api_client):
    return DynamicClient(api_client)


@pytest.fixture(scope="module")
def project_namespace(api_client):
    core = client.CoreV1Api(api_client)
    try:
        core.create_namespace({"metadata": {"name": PROJECT_NS}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    return PROJECT_NS


def _dry_run_apply(dyn: DynamicClient, obj: dict) -> dict:
    res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    ns = obj["metadata"].get("namespace") if res.namespaced else None
    if res.namespaced:
        assert ns, f"namespaced {obj['kind']}/{obj['metadata']['name']} has no namespace"
    out = res.server_side_apply(
        body=obj,
        name=obj["metadata"]["name"],
        namespace=ns,
        field_manager="tf-e2e",
        force_conflicts=True,
        dry_run="All",
    )
    return out.to_dict()


def _kinds(objs):
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objs)


def test_render_matches_kubectl_kustomize():
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl not installed")
    for d in (cpl.MANIFESTS, cpl.MANIFESTS / "crds", cpl.MANIFESTS / "optional", cpl.MANIFESTS / "defaults"):
        try:
            out = subprocess.run(
                [kubectl, "kustomize", str(d)], capture_output=True, text=True, timeout=60, check=True
            ).stdout
        except (subprocess.SubprocessError, OSError) as exc:
            pytest.skip(f"kubectl kustomize unavailable: {exc}")
        theirs = [o for o in yaml.safe_load_all(out) if o]
        ours = cpl.render_kustomization(d)

        def key(o):
            return o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]

        assert {key(o): o for o in theirs} == {key(o): o for o in ours}


def test_every_manifest_passes_server_side_dry_run(dyn, project_namespace, karpenter_crds):
    objs = cpl.render_kustomization(cpl.MANIFESTS)
    assert "CustomResourceDefinition" not in {o["kind"] for o in objs}  # the base installs no CRD
    objs += cpl.render_kustomization(cpl.CRDS_DIR)
    kinds = _kinds(objs)
    for expected in (
        "Namespace/tensor-fusion-sys",
        "ConfigMap/tensor-fusion-scheduler-config",
        "Deployment/tensor-fusion-scheduler",
        "Deployment/tensor-fusion-webhook",
        "PodDisruptionBudget/tensor-fusion-webhook",
        "Service/tensor-fusion-webhook",
        "MutatingWebhookConfiguration/tensor-fusion-webhook",
        "PodDisruptionBudget/tensor-fusion-scheduler",
        "NetworkPolicy/tensor-fusion-default-deny-ingress",
        "NetworkPolicy/tensor-fusion-webhook-admission",
        "NetworkPolicy/tensor-fusion-metrics",
        "ValidatingAdmissionPolicy/tensor-fusion-allocations",
        "ValidatingAdmissionPolicyBinding/tensor-fusion-allocations",
        "ValidatingAdmissionPolicy/tensor-fusion-extender-pod-writes",
        "ValidatingAdmissionPolicyBinding/tensor-fusion-extender-pod-writes",
        "PriorityClass/tensor-fusion-high",
        "PriorityClass/tensor-fusion-critical",
        "CustomResourceDefinition/gpus.tensor-fusion.ai",
    ):
        assert expected in kinds
    optional = cpl.render_kustomization(cpl.MANIFESTS / "optional")
    assert _kinds(optional) == ["NodeOverlay/tensor-fusion-overlay"]
    defaults = cpl.render_kustomization(cpl.MANIFESTS / "defaults")
    assert _kinds(defaults) == [
        "SchedulingConfigTemplate/tf-scheduling-config",
        "TensorFusionCluster/tensor-fusion",
    ]
    failures = []
    for obj in objs + optional + defaults:
        try:
            out = _dry_run_apply(dyn, copy.deepcopy(obj))
            assert out["kind"] == obj["kind"]
        except ApiException as exc:
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.status} {exc.body}")
    assert not failures, "\n".join(failures)


def test_scheduler_configmap_is_the_plain_file():
    objs = cpl.render_kustomization(cpl.MANIFESTS)
    cm = next(
        o
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "tensor-fusion-scheduler-config"
    )
    assert cm["data"]["kube-scheduler-config.yaml"] == cpl.SCHEDULER_CONFIG.read_text()
    dep = next(
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "tensor-fusion-scheduler"
    )
    vols = dep["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": "tensor-fusion-scheduler-config"}} in vols
    args = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--config=/etc/tensor-fusion/scheduler/kube-scheduler-config.yaml" in args


def _apply_for_real(dyn: DynamicClient, path: Path) -> None:
    for obj in cpl.load_yaml_docs(path):
        res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        res.server_side_apply(
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace"),
            field_manager="tf-e2e",
            force_conflicts=True,
        )


def _can(
    api_client, sa: str, verb: str, resource: str, group: str = "", ns: str | None = None, sub: str = ""
):
    user = f"system:serviceaccount:{PROJECT_NS}:{sa}"
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{PROJECT_NS}",
                "system:authenticated",
            ],
            "resourceAttributes": {"verb": verb, "resource": resource, "group": group, "subresource": sub}
            | ({"namespace": ns} if ns else {}),
        },
    }
    out = client.AuthorizationV1Api(api_client).create_subject_access_review(body)
    return out.status.allowed


def test_service_account_kubeconfig_is_bound_by_shipped_rbac(
    control_plane, api_client, dyn, project_namespace
):
    _apply_for_real(dyn, cpl.MANIFESTS / "rbac.yaml")
    kc = control_plane.kubeconfig_for_service_account(PROJECT_NS, "tensor-fusion-webhook")
    as_webhook = control_plane.api_client(kc)
    try:
        custom = client.CustomObjectsApi(as_webhook)
        cpl.wait_until(
            lambda: custom.list_cluster_custom_object("tensor-fusion.ai", "v1", "gpupools"),
            10,
            what="webhook may list gpupools",
        )
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(as_webhook).list_namespaced_secret("default")
        assert err.value.status == 403
    finally:
        as_webhook.close()


def test_shipped_rbac_grants_what_the_components_need_and_no_more(api_client, dyn, project_namespace):
    _apply_for_real(dyn, cpl.MANIFESTS / "rbac.yaml")

    def can(*a, **kw):
        # RBAC caches are fed by informers: the new bindings take a moment to count
        return cpl.wait_until(lambda: _can(api_client, *a, **kw), 10, what=f"{a} allowed")

    # extender (sidecar, runs as the scheduler's ServiceAccount)
    for verb, res, group, sub in [
        ("watch", "pods", "", ""),
        ("patch", "pods", "", ""),
        ("create", "pods", "", "binding"),
        ("watch", "nodes", "", ""),
        ("list", "gpus", "tensor-fusion.ai", ""),
        ("watch", "gpupools", "tensor-fusion.ai", ""),
        ("get", "schedulingconfigtemplates", "tensor-fusion.ai", ""),
        ("create", "events", "", ""),
        ("list", "nodepools", "karpenter.sh", ""),
        ("create", "nodeclaims", "karpenter.sh", ""),
        ("patch", "gpus", "tensor-fusion.ai", "status"),  # --write-gpu-status
        ("patch", "gpupools", "tensor-fusion.ai", "status"),
        ("list", "poddisruptionbudgets", "policy", ""),  # defragmentation, preemption
        ("watch", "poddisruptionbudgets", "policy", ""),  # preemption's PDB cache
        ("create", "pods", "", "eviction"),  # preemption and defragmentation evict, never delete
        ("delete", "nodeclaims", "karpenter.sh", ""),  # compaction releases Karpenter-mode nodes
        ("watch", "gpuresourcequotas", "tensor-fusion.ai", ""),  # the quota rule
        ("patch", "gpuresourcequotas", "tensor-fusion.ai", "status"),
    ]:
        assert can("tensor-fusion-scheduler", verb, res, group, ns="default", sub=sub)
    # the scheduler's own lease
    assert can("tensor-fusion-scheduler", "create", "leases", "coordination.k8s.io", ns=PROJECT_NS)
    # Cluster Autoscaler placeholder and GPU reservation pods: in the project's namespace only
    assert can("tensor-fusion-scheduler", "create", "pods", "", ns=PROJECT_NS)
    assert can("tensor-fusion-scheduler", "delete", "pods", "", ns=PROJECT_NS)
    assert not _can(api_client, "tensor-fusion-scheduler", "create", "pods", "", ns="default")
    # webhook
    for verb, res, group in [
        ("get", "gpupools", "tensor-fusion.ai"),
        ("list", "workloadprofiles", "tensor-fusion.ai"),
        ("watch", "schedulingconfigtemplates", "tensor-fusion.ai"),
        ("watch", "gpuresourcequotas", "tensor-fusion.ai"),  # single.defaultRequests / defaultLimits
        ("get", "replicasets", "apps"),
        ("get", "jobs", "batch"),
    ]:
        assert can("tensor-fusion-webhook", verb, res, group, ns="default")
    # and no more
    for sa, verb, res, group in [
        ("tensor-fusion-webhook", "patch", "pods", ""),
        ("tensor-fusion-webhook", "list", "secrets", ""),
        ("tensor-fusion-webhook", "create", "events", ""),
        ("tensor-fusion-scheduler", "list", "secrets", ""),
        ("tensor-fusion-scheduler", "update", "gpus", "tensor-fusion.ai"),
        ("tensor-fusion-scheduler", "update", "poddisruptionbudgets", "policy"),
        ("tensor-fusion-webhook", "list", "replicasets", "apps"),  # the webhook only gets owners
        ("tensor-fusion-webhook", "watch", "replicasets", "apps"),
        ("tensor-fusion-webhook", "list", "jobs", "batch"),
        ("tensor-fusion-webhook", "watch", "jobs", "batch"),
    ]:
        assert not _can(api_client, sa, verb, res, group, ns="default"), (sa, verb, res)


# ------------------------------------------------------------------ CRD compatibility with upstream

TENSOR_FUSION_EXAMPLES = cpl.REPO_ROOT / "tests" / "compat" / "tensor-fusion"


def _shipped_plurals() -> list[str]:
    return sorted(
        cpl.load_yaml_docs(p)[0]["spec"]["names"]["plural"]
        for p in cpl.project_crd_files()
        if (TENSOR_FUSION_EXAMPLES / f"{p.stem.split('_', 1)[1]}-maximal.yaml").exists()
    )


def _example(plural: str, suffix: str) -> dict:
    (obj,) = cpl.load_yaml_docs(TENSOR_FUSION_EXAMPLES / f"{plural}-{suffix}.yaml")
    return obj


def _namespaced(plural: str) -> bool:
    (crd,) = cpl.load_yaml_docs(cpl.CRDS_DIR / f"tensor-fusion.ai_{plural}.yaml")
    return crd["spec"]["scope"] == "Namespaced"


def _store(custom, plural: str, obj: dict, name: str) -> dict:
    """Create ``obj`` (status through the status subresource) and return what the API server kept; the
    object is deleted again, so that no later module's controllers act on it (a stored TensorFusionCluster
    would have its default pool derived in every module after this one)."""
    ns, namespaced = "default", _namespaced(plural)
    group, version = cpl.TF_GROUP, cpl.TF_VERSION
    body = copy.deepcopy(obj)
    body["metadata"] = {"name": name}
    status = body.pop("status", None)
    if namespaced:
        custom.create_namespaced_custom_object(group, version, ns, plural, body)
    else:
        custom.create_cluster_custom_object(group, version, plural, body)
    try:
        return _stored(custom, plural, name, status, ns, namespaced)
    finally:
        with contextlib.suppress(ApiException):
            if namespaced:
                custom.delete_namespaced_custom_object(group, version, ns, plural, name)
            else:
                custom.delete_cluster_custom_object(group, version, plural, name)


def _stored(custom, plural: str, name: str, status: dict | None, ns: str, namespaced: bool) -> dict:
    group, version = cpl.TF_GROUP, cpl.TF_VERSION
    if status is not None:
        if namespaced:
            custom.patch_namespaced_custom_object_status(group, version, ns, plural, name, {"status": status})
        else:
            custom.patch_cluster_custom_object_status(group, version, plural, name, {"status": status})
    if namespaced:
        got = custom.get_namespaced_custom_object(group, version, ns, plural, name)
    else:
        got = custom.get_cluster_custom_object(group, version, plural, name)
    return {k: v for k, v in got.items() if k in ("spec", "status")}


@pytest.mark.parametrize("plural", _shipped_plurals())
def test_project_crd_stores_a_maximal_tensor_fusion_object_unchanged(api_client, plural):
    """Nothing TensorFusion accepts is rejected or pruned by our CRD."""
    obj = _example(plural, "maximal")
    stored = _store(client.CustomObjectsApi(api_client), plural, obj, f"e2e-maximal-{plural}")
    assert stored == {k: v for k, v in obj.items() if k in ("spec", "status")}


GPU_STATUS_FIELDS_WE_READ = (
    "capacity", "gpuModel", "vendor", "phase", "usedBy", "isolationMode", "nodeSelector", "index"
)
PROFILE_FIELDS_WE_READ = ("gpuCount", "isolation", "qos", "gpuModel")


@pytest.mark.parametrize("plural", _shipped_plurals())
def test_project_crd_defaults_a_minimal_object_as_tensor_fusion_does(api_client, plural):
    """``<plural>-minimal-defaulted.yaml`` is how TensorFusion's own CRD stores the minimal object; ours
    must agree on every field this project reads (deeper defaults of fields we keep opaque may differ)."""
    stored = _store(
        client.CustomObjectsApi(api_client), plural, _example(plural, "minimal"), f"e2e-minimal-{plural}"
    )
    expected = _example(plural, "minimal-defaulted")

    def fields_we_read(o):
        spec, status = o.get("spec", {}), o.get("status", {})
        return {
            "gpus": lambda: {k: status.get(k) for k in GPU_STATUS_FIELDS_WE_READ},
            "gpupools": lambda: {
                "mode": spec.get("nodeManagerConfig", {}).get("provisioningMode"),
                "tmpl": spec.get("schedulingConfigTemplate"),
                "capacity": spec.get("capacityConfig"),
            },
            "schedulingconfigtemplates": lambda: spec.get("placement", {}).get("mode"),
            "workloadprofiles": lambda: {k: spec.get(k) for k in PROFILE_FIELDS_WE_READ},
            "gpunodeclaims": lambda: spec,
            "tensorfusionclusters": lambda: spec.get("gpuPools"),
            "gpunodes": lambda: {k: status.get(k)
                                 for k in ("phase", "totalTFlops", "totalVRAM", "totalGPUs")},
            "gpunodeclasses": lambda: spec,
            "gpuresourcequotas": lambda: spec,
            "tensorfusionworkloads": lambda: spec,
        }[plural]()

    assert fields_we_read(stored) == fields_we_read(expected)
