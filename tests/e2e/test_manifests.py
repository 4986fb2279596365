"""The manifests a cluster admin applies, checked against the real API server:

- every object kustomize renders from manifests/ (and manifests/optional/) passes a server-side apply dry
  run (dryRun=All);
- the project's CRDs are a compatible subset of TensorFusion's: a maximal object generated from each
  upstream schema is stored by our CRD exactly as by the upstream CRD (installed side by side under another
  API group), so nothing valid upstream is rejected or pruned.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from . import controlplane as cpl

pytestmark = pytest.mark.e2e

PROJECT_NS = "tensor-fusion-system"
UPSTREAM_GROUP = "upstream.tensor-fusion.test"


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
    for d in (cpl.MANIFESTS, cpl.MANIFESTS / "optional"):
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
    kinds = _kinds(objs)
    for expected in (
        "Namespace/tensor-fusion-system",
        "ConfigMap/tensor-fusion-scheduler-config",
        "Deployment/tensor-fusion-scheduler",
        "Deployment/tensor-fusion-webhook",
        "PodDisruptionBudget/tensor-fusion-webhook",
        "Service/tensor-fusion-webhook",
        "MutatingWebhookConfiguration/tensor-fusion-webhook",
        "PriorityClass/tensor-fusion-high",
        "PriorityClass/tensor-fusion-critical",
        "CustomResourceDefinition/gpus.tensor-fusion.ai",
    ):
        assert expected in kinds
    optional = cpl.render_kustomization(cpl.MANIFESTS / "optional")
    assert _kinds(optional) == ["NodeOverlay/tensor-fusion-index-resources"]
    failures = []
    for obj in objs + optional:
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
    ]:
        assert can("tensor-fusion-scheduler", verb, res, group, ns="default", sub=sub)
    # the scheduler's own lease
    assert can("tensor-fusion-scheduler", "create", "leases", "coordination.k8s.io", ns=PROJECT_NS)
    # webhook
    for verb, res, group in [
        ("get", "gpupools", "tensor-fusion.ai"),
        ("list", "workloadprofiles", "tensor-fusion.ai"),
        ("watch", "schedulingconfigtemplates", "tensor-fusion.ai"),
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
        ("tensor-fusion-scheduler", "delete", "nodeclaims", "karpenter.sh"),
    ]:
        assert not _can(api_client, sa, verb, res, group, ns="default"), (sa, verb, res)


# ------------------------------------------------------------------ CRD compatibility with upstream

QUANTITY_PATTERN_START = "^(\\+|-)?(([0-9]+"


def _enum(schema: dict) -> list | None:
    """The allowed values, intersecting enums of allOf members."""
    enums = [schema["enum"]] if schema.get("enum") else []
    enums += [s["enum"] for s in schema.get("allOf", []) if s.get("enum")]
    if not enums:
        return None
    return [v for v in enums[0] if all(v in e for e in enums[1:])]


def _sample_string(schema: dict) -> str:
    if _enum(schema):
        return _enum(schema)[0]
    if schema.get("format") == "date-time":
        return "2024-01-01T00:00:00Z"
    pattern = schema.get("pattern", "")
    if pattern.startswith(QUANTITY_PATTERN_START):
        return "2"
    if pattern.startswith("^[A-Za-z]"):
        return "Ready"
    return "x"


def sample(schema: dict, depth: int = 0):
    """A maximal value valid for ``schema``: every property set, one item per list, one key per map, and an
    extra unknown field wherever unknown fields are preserved."""
    if schema.get("x-kubernetes-int-or-string"):
        return _sample_string(schema)
    if "anyOf" in schema and not schema.get("type"):
        return sample(schema["anyOf"][0] | {k: v for k, v in schema.items() if k != "anyOf"}, depth)
    t = schema.get("type")
    if t == "string":
        return _sample_string(schema)
    if t == "integer":
        lo, hi = schema.get("minimum", 0), schema.get("maximum", 1 << 30)
        return max(lo, min(hi, 2))
    if t == "number":
        return 2
    if t == "boolean":
        return True
    if t == "array":
        return [sample(schema.get("items", {}), depth + 1)]
    if t == "object" or "properties" in schema or "additionalProperties" in schema:
        out = {}
        for k, v in (schema.get("properties") or {}).items():
            if depth == 0 and k in ("apiVersion", "kind", "metadata"):
                continue
            out[k] = sample(v, depth + 1)
        if isinstance(schema.get("additionalProperties"), dict):
            out["key-1"] = sample(schema["additionalProperties"], depth + 1)
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            out["e2eUnknownField"] = {"nested": ["kept", 1]}
        return out
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return {"e2eUnknownField": 1}
    return "x"


def _upstream_crds() -> dict[str, dict]:
    out = {}
    for p in sorted(cpl.TENSOR_FUSION_UPSTREAM_CRDS_DIR.glob("*.yaml")):
        for d in cpl.load_yaml_docs(p):
            out[d["spec"]["names"]["plural"]] = d
    return out


@pytest.fixture(scope="module")
def upstream_side_by_side(api_client, tmp_path_factory):
    """The upstream TensorFusion CRDs for our four kinds, renamed into group upstream.tensor-fusion.test."""
    d = tmp_path_factory.mktemp("upstream-crds")
    ours = {p.name for p in cpl.project_crd_files()}
    paths = []
    for plural, crd in _upstream_crds().items():
        if f"tensor-fusion.ai_{plural}.yaml" not in ours:
            continue
        crd = copy.deepcopy(crd)
        crd["spec"]["group"] = UPSTREAM_GROUP
        crd["metadata"] = {"name": f"{plural}.{UPSTREAM_GROUP}"}
        p = Path(d) / f"{plural}.yaml"
        p.write_text(yaml.safe_dump(crd))
        paths.append(p)
    cpl.apply_crds(api_client, paths)
    return {p.stem for p in paths}


def _store(custom, group: str, plural: str, namespaced: bool, obj: dict) -> dict:
    ns = "default"
    body = copy.deepcopy(obj)
    body["apiVersion"] = f"{group}/v1"
    status = body.pop("status", None)
    if namespaced:
        custom.create_namespaced_custom_object(group, "v1", ns, plural, body)
    else:
        custom.create_cluster_custom_object(group, "v1", plural, body)
    if status is not None:
        if namespaced:
            custom.patch_namespaced_custom_object_status(
                group, "v1", ns, plural, body["metadata"]["name"], {"status": status}
            )
        else:
            custom.patch_cluster_custom_object_status(
                group, "v1", plural, body["metadata"]["name"], {"status": status}
            )
    if namespaced:
        got = custom.get_namespaced_custom_object(group, "v1", ns, plural, body["metadata"]["name"])
    else:
        got = custom.get_cluster_custom_object(group, "v1", plural, body["metadata"]["name"])
    return {k: v for k, v in got.items() if k in ("spec", "status")}


@pytest.mark.parametrize("plural", ["gpus", "gpupools", "schedulingconfigtemplates", "workloadprofiles"])
def test_project_crd_accepts_everything_upstream_accepts(api_client, upstream_side_by_side, plural):
    upstream = _upstream_crds()[plural]
    schema = upstream["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    namespaced = upstream["spec"]["scope"] == "Namespaced"
    obj = sample(schema)
    obj.update({"kind": upstream["spec"]["names"]["kind"], "metadata": {"name": f"maximal-{plural}"}})
    custom = client.CustomObjectsApi(api_client)
    stored_upstream = _store(custom, UPSTREAM_GROUP, plural, namespaced, obj)
    stored_ours = _store(custom, "tensor-fusion.ai", plural, namespaced, obj)
    # the sample really is maximal: upstream kept what we sent
    assert stored_upstream == {k: v for k, v in obj.items() if k in ("spec", "status")}
    assert stored_ours == stored_upstream


@pytest.mark.parametrize("plural", ["gpus", "gpupools", "schedulingconfigtemplates", "workloadprofiles"])
def test_project_crd_defaults_match_upstream_for_minimal_objects(api_client, upstream_side_by_side, plural):
    upstream = _upstream_crds()[plural]
    namespaced = upstream["spec"]["scope"] == "Namespaced"
    minimal = {
        "gpus": {
            "status": {
                "capacity": {"tflops": "10", "vram": "1Gi"},
                "available": {"tflops": "10", "vram": "1Gi"},
                "gpuModel": "A100",
                "message": "",
                "nodeSelector": {"kubernetes.io/hostname": "n"},
                "phase": "Running",
                "uuid": "u",
                "vendor": "NVIDIA",
            }
        },
        "gpupools": {"spec": {"nodeManagerConfig": {"provisioningMode": "AutoSelect"}}},
        "schedulingconfigtemplates": {"spec": {"placement": {"mode": "LowLoadFirst"}}},
        "workloadprofiles": {"spec": {"gpuCount": 2}},
    }[plural]
    obj = {"kind": upstream["spec"]["names"]["kind"], "metadata": {"name": f"minimal-{plural}"}, **minimal}
    custom = client.CustomObjectsApi(api_client)
    stored_upstream = _store(custom, UPSTREAM_GROUP, plural, namespaced, obj)
    stored_ours = _store(custom, "tensor-fusion.ai", plural, namespaced, obj)

    def fields_we_read(o):
        # compare what this project reads; upstream defaults deeper fields we keep opaque
        spec, status = o.get("spec", {}), o.get("status", {})
        return {
            "gpus": lambda: {
                k: status.get(k)
                for k in (
                    "capacity",
                    "gpuModel",
                    "vendor",
                    "phase",
                    "usedBy",
                    "isolationMode",
                    "nodeSelector",
                    "index",
                )
            },
            "gpupools": lambda: {
                "mode": spec.get("nodeManagerConfig", {}).get("provisioningMode"),
                "tmpl": spec.get("schedulingConfigTemplate"),
            },
            "schedulingconfigtemplates": lambda: spec.get("placement", {}).get("mode"),
            "workloadprofiles": lambda: {
                k: spec.get(k) for k in ("gpuCount", "isolation", "qos", "gpuModel")
            },
        }[plural]()

    assert fields_we_read(stored_ours) == fields_we_read(stored_upstream)
