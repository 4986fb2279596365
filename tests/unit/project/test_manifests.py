"""Static checks of manifests/ (no cluster needed). The server-side dry run of every manifest against a
real API server is in tests/e2e/test_manifests.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.unit.fixtures import ROOT

MANIFESTS = ROOT / "manifests"
TENSOR_FUSION_EXAMPLES = ROOT / "tests" / "compat" / "tensor-fusion"
INDEX_NAMES = [f"tensor-fusion.ai/index_{k:x}" for k in range(16)]
# default kube-scheduler score plugins and their weights (v1.36 defaults)
IN_TREE_SCORE_WEIGHTS = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesFit": 1,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
    "VolumeBinding": 1,
}


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_objects() -> list[dict]:
    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    out = []
    for r in k["resources"]:
        out.extend(docs(MANIFESTS / r))
    return out


def find(kind: str, name: str) -> dict:
    return next(o for o in all_objects() if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.fixture(scope="module")
def sched_cfg() -> dict:
    return yaml.safe_load((MANIFESTS / "scheduler" / "kube-scheduler-config.yaml").read_text())


def test_kustomization_lists_every_manifest():
    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = {MANIFESTS / r for r in k["resources"]}
    on_disk = {
        p
        for p in MANIFESTS.rglob("*.yaml")
        if p.name != "kustomization.yaml"
        and "optional" not in p.parts
        and "defaults" not in p.parts
        and "crds" not in p.parts
        and "scheduler" not in p.parent.parts[-1:]
    }
    assert on_disk == listed
    gen = k["configMapGenerator"][0]
    assert gen["name"] == "tensor-fusion-scheduler-config"
    assert gen["files"] == ["kube-scheduler-config.yaml=scheduler/kube-scheduler-config.yaml"]
    opt = yaml.safe_load((MANIFESTS / "optional" / "kustomization.yaml").read_text())
    assert opt["resources"] == ["karpenter-nodeoverlay.yaml"]
    defaults = yaml.safe_load((MANIFESTS / "defaults" / "kustomization.yaml").read_text())
    assert {MANIFESTS / "defaults" / r for r in defaults["resources"]} == set(
        (MANIFESTS / "defaults").glob("*.yaml")
    ) - {MANIFESTS / "defaults" / "kustomization.yaml"}


def test_the_base_installs_no_crd():
    """Deleting the base must never delete a CRD (and every object of its kind), nor applying it replace
    TensorFusion's: the CRDs are manifests/crds/, installed on purpose (tf-extender crds apply)."""
    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert not [r for r in k["resources"] if "crds" in Path(r).parts]
    assert not [o for o in all_objects() if o["kind"] == "CustomResourceDefinition"]


def test_the_crd_folder_lists_exactly_the_crd_files_present():
    k = yaml.safe_load((MANIFESTS / "crds" / "kustomization.yaml").read_text())
    on_disk = sorted(p.name for p in (MANIFESTS / "crds").glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(k["resources"]) == on_disk, "list every manifests/crds/*.yaml in its kustomization.yaml"
    assert set(k) == {"apiVersion", "kind", "resources"}
    for name in on_disk:
        (crd,) = docs(MANIFESTS / "crds" / name)
        assert crd["kind"] == "CustomResourceDefinition", name
        # what tf-extender crds recognizes as ours
        assert crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "tensor-fusion-extender", name


def test_scheduler_configuration(sched_cfg):
    assert sched_cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert sched_cfg["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in sched_cfg["profiles"]] == ["tensor-fusion-scheduler"]
    le = sched_cfg["leaderElection"]
    assert le["leaderElect"] is True and le["resourceName"] == "tensor-fusion-scheduler"
    (ext,) = sched_cfg["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:8080/scheduler"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"], ext["preemptVerb"]) == (
        "filter",
        "prioritize",
        "bind",
        "preempt",
    )
    assert ext["nodeCacheCapable"] is True and ext["enableHTTPS"] is False and ext["httpTimeout"] == "60s"
    assert [m["name"] for m in ext["managedResources"]] == INDEX_NAMES
    assert all(m["ignoredByScheduler"] is True for m in ext["managedResources"])


def test_extender_weight_lets_its_first_choice_win(sched_cfg):
    (ext,) = sched_cfg["extenders"]
    max_node_score, max_extender_priority = 100, 10
    one_extender_point = 1 * (max_node_score // max_extender_priority) * ext["weight"]
    in_tree_spread = max_node_score * sum(IN_TREE_SCORE_WEIGHTS.values())
    assert one_extender_point > in_tree_spread


def test_scheduler_deployment_matches_config(sched_cfg):
    dep = find("Deployment", "tensor-fusion-scheduler")
    spec = dep["spec"]["template"]["spec"]
    sched, extender = spec["containers"]
    assert sched["image"] == "registry.k8s.io/kube-scheduler"  # tagged by kustomization.yaml
    assert extender["image"] == "tensor-fusion-extender"  # tagged by kustomization.yaml
    assert extender["command"][:2] == ["tf-extender", "serve"]
    assert "--port=8080" in extender["command"] and "--bind-address=127.0.0.1" in extender["command"]
    assert extender["ports"] == [{"name": "metrics", "containerPort": 9090}]  # the verbs: loopback only
    assert spec["serviceAccountName"] == "tensor-fusion-scheduler"
    assert spec["volumes"] == [
        {"name": "config", "configMap": {"name": "tensor-fusion-scheduler-config"}},
        # Provisioned mode's cloud keys: TensorFusion's Secret and path; the pod starts without it
        {"name": "cloud-vendor-credentials",
         "secret": {"secretName": "tf-cloud-vendor-credentials", "optional": True}}]
    assert extender["volumeMounts"] == [
        {"name": "cloud-vendor-credentials", "mountPath": "/tmp/secret", "readOnly": True}]


def test_kube_scheduler_is_pinned_once_at_the_version_the_tests_run():
    import re

    images = {i["name"]: i for i in yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["images"]}
    script = (MANIFESTS.parent / "tests" / "harness" / "build-control-plane.sh").read_text()
    tested = re.search(r'K8S_VERSION="\$\{K8S_VERSION:-(v[0-9.]+)\}"', script)
    assert tested is not None
    assert images["registry.k8s.io/kube-scheduler"]["newTag"] == tested[1]
    compat = (MANIFESTS.parent / "docs" / "install.md").read_text()
    assert f"| Kubernetes | {tested[1]} |" in compat  # the compatibility table says the same


def test_webhook_scope_matches_design():
    mwc = find("MutatingWebhookConfiguration", "tensor-fusion-webhook")
    (wh,) = mwc["webhooks"]
    assert wh["clientConfig"]["service"]["path"] == "/mutate"
    assert wh["objectSelector"] == {"matchLabels": {"tensor-fusion.ai/enabled": "true"}}
    assert wh["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert wh["failurePolicy"] == "Fail" and wh["sideEffects"] == "None"
    assert wh["admissionReviewVersions"] == ["v1"] and wh["reinvocationPolicy"] == "IfNeeded"
    assert wh["timeoutSeconds"] == 10
    assert wh["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["tensor-fusion-sys"]}
        ]
    }
    dep = find("Deployment", "tensor-fusion-webhook")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "tf-webhook",
        "serve",
        "--port=9443",
        "--metrics-port=9090",
        "--cert-dir=/certs",
        "--qos-priority-namespaces=tensor-fusion-sys",  # high and critical priority: the project's only
    ]
    assert find("PodDisruptionBudget", "tensor-fusion-webhook")["spec"]["minAvailable"] == 1
    svc = find("Service", "tensor-fusion-webhook")
    assert svc["spec"]["ports"][0]["targetPort"] == 9443


def test_priority_classes():
    assert find("PriorityClass", "tensor-fusion-high")["value"] == 100000
    assert find("PriorityClass", "tensor-fusion-critical")["value"] == 1000000
    assert not find("PriorityClass", "tensor-fusion-high")["globalDefault"]


def _rules(name: str) -> list[dict]:
    return find("ClusterRole", name)["rules"]


EXTENDER_ROLES = ("tensor-fusion-extender", "tensor-fusion-extender-node-patch",
                  "tensor-fusion-extender-node-delete", "tensor-fusion-extender-tensorfusionclusters")


def test_rbac_is_least_privilege():
    for role in (*EXTENDER_ROLES, "tensor-fusion-webhook"):
        for r in _rules(role):
            assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"]
            assert "secrets" not in r["resources"]
            assert not {"deletecollection", "update", "escalate", "bind", "impersonate"} & set(r["verbs"])
            # deleting is only for the claims of nodes that compaction releases, the GPUPools a
            # TensorFusionCluster no longer lists, the GPUNodes of nodes that are gone, and the Node of a
            # Provisioned-mode VM once the VM is terminated
            assert "delete" not in r["verbs"] or set(r["resources"]) <= {
                "nodeclaims", "gpunodeclaims", "gpupools", "gpunodes", "nodes"}
    for r in _rules("tensor-fusion-webhook"):
        assert set(r["verbs"]) <= {"get", "list", "watch"}
    granted = {
        (g, res, v)
        for role in EXTENDER_ROLES
        for r in _rules(role)
        for g in r["apiGroups"]
        for res in r["resources"]
        for v in r["verbs"]
    }
    for needed in [
        ("", "pods", "patch"),
        ("", "pods/binding", "create"),
        ("", "nodes", "watch"),
        ("tensor-fusion.ai", "gpus", "watch"),
        ("karpenter.sh", "nodeclaims", "create"),
        ("karpenter.sh", "nodepools", "list"),
        ("tensor-fusion.ai", "gpus/status", "patch"),
        ("tensor-fusion.ai", "gpupools/status", "patch"),
        ("", "events", "create"),
        ("karpenter.sh", "nodeclaims", "delete"),
        ("tensor-fusion.ai", "gpunodeclaims/status", "patch"),
        ("", "nodes", "patch"),
        ("", "nodes", "delete"),
        ("tensor-fusion.ai", "gpunodeclasses", "watch"),
    ]:
        assert needed in granted
    bound = {
        (b["roleRef"]["name"], b["subjects"][0]["name"])
        for b in all_objects()
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
    }
    for role in (
        "system:kube-scheduler",
        "system:volume-scheduler",
        "tensor-fusion-extender",
        "tensor-fusion-scheduler-leader-election",
        *EXTENDER_ROLES,
    ):
        assert (role, "tensor-fusion-scheduler") in bound
    # a feature's own rights are in its own role (the chart renders it only with the feature), and no
    # ConfigMap is readable without its name
    core = {(res, v) for r in _rules("tensor-fusion-extender") for res in r["resources"] for v in r["verbs"]}
    assert not {("nodes", "patch"), ("nodes", "delete"), ("gpupools", "create"), ("gpupools", "patch"),
                ("gpupools", "delete")} & core
    assert not [r for o in all_objects() if o["kind"] in ("Role", "ClusterRole") for r in o.get("rules") or []
                if "configmaps" in r["resources"] and not r.get("resourceNames")]
    assert ("tensor-fusion-webhook", "tensor-fusion-webhook") in bound


def test_nodeoverlay_declares_every_index_resource():
    (ov,) = docs(MANIFESTS / "optional" / "karpenter-nodeoverlay.yaml")
    assert ov["apiVersion"] == "karpenter.sh/v1alpha1" and ov["kind"] == "NodeOverlay"
    assert sorted(ov["spec"]["capacity"]) == INDEX_NAMES
    # every node must admit the worst case: max pods all in one index group with quantity 8
    assert all(int(v) >= 8 * 110 for v in ov["spec"]["capacity"].values())
    # TensorFusion's name, on every NodePool, kept on helm uninstall as TensorFusion's
    assert ov["metadata"]["name"] == "tensor-fusion-overlay"
    assert ov["spec"]["requirements"] == []
    assert ov["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_default_objects_are_tensorfusions_under_its_names():
    objs = {o["kind"]: o for o in docs(MANIFESTS / "defaults" / "scheduling-config.yaml")
            + docs(MANIFESTS / "defaults" / "tensorfusioncluster.yaml")}
    assert sorted(objs) == ["SchedulingConfigTemplate", "TensorFusionCluster"]
    sct, tfc = objs["SchedulingConfigTemplate"], objs["TensorFusionCluster"]
    assert sct["metadata"]["name"] == "tf-scheduling-config"
    assert sct["spec"]["placement"]["mode"] == "NodeCompactGPULowLoad"
    assert tfc["metadata"]["name"] == "tensor-fusion"
    (pool,) = tfc["spec"]["gpuPools"]
    assert (pool["name"], pool["isDefault"]) == ("shared", True)
    assert pool["specTemplate"]["schedulingConfigTemplate"] == "tf-scheduling-config"
    terms = pool["specTemplate"]["nodeManagerConfig"]["nodeSelector"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]
    for obj in objs.values():
        assert obj["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


# ------------------------------------------------- CRDs vs TensorFusion's objects, statically
#
# tests/compat/tensor-fusion/ holds the project's own example objects, a maximal and a minimal one per kind,
# written from TensorFusion's published field list. Our CRDs must keep every field of the maximal ones (the
# API server prunes what a structural schema does not declare); tests/e2e/test_manifests.py stores them on a
# real API server.

# TensorFusion's names for the kinds we ship (group tensor-fusion.ai, version v1)
TENSOR_FUSION_KINDS = {
    "gpus": ("GPU", "Cluster"),
    "gpupools": ("GPUPool", "Cluster"),
    "schedulingconfigtemplates": ("SchedulingConfigTemplate", "Cluster"),
    "workloadprofiles": ("WorkloadProfile", "Namespaced"),
    "gpunodeclaims": ("GPUNodeClaim", "Cluster"),
    "tensorfusionclusters": ("TensorFusionCluster", "Cluster"),
    "gpunodes": ("GPUNode", "Cluster"),
    "gpunodeclasses": ("GPUNodeClass", "Cluster"),
    "tensorfusionworkloads": ("TensorFusionWorkload", "Namespaced"),
    "gpuresourcequotas": ("GPUResourceQuota", "Namespaced"),
}
SHIPPED_PLURALS = sorted(
    p for p in TENSOR_FUSION_KINDS if (MANIFESTS / "crds" / f"tensor-fusion.ai_{p}.yaml").exists()
)


def _schema(crd: dict) -> dict:
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v["schema"]["openAPIV3Schema"]


def pruned_paths(value: object, schema: dict, path: str = "") -> list[str]:
    """The paths of ``value`` that an API server would drop when storing it under ``schema``."""
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if path == "" and k in ("apiVersion", "kind", "metadata"):
                continue
            if k in props:
                out += pruned_paths(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                out += pruned_paths(v, extra, f"{path}.{k}")
            elif not (extra is True or schema.get("x-kubernetes-preserve-unknown-fields")):
                out.append(f"{path}.{k}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += pruned_paths(item, schema.get("items") or {}, f"{path}[{i}]")
    return out


def test_pruned_paths_finds_undeclared_fields():
    spec = {
        "a": {"type": "string"},
        "m": {"additionalProperties": {"properties": {"x": {}}}},
        "open": {"x-kubernetes-preserve-unknown-fields": True},
    }
    schema = {"properties": {"spec": {"properties": spec}}}
    obj = {"kind": "K", "spec": {"a": "1", "b": 2, "m": {"k": {"x": 1, "y": 2}}, "open": {"anything": 1}}}
    assert pruned_paths(obj, schema) == [".spec.b", ".spec.m.k.y"]


def test_the_examples_cover_every_shipped_crd():
    assert {"gpus", "gpupools", "schedulingconfigtemplates", "workloadprofiles"} <= set(SHIPPED_PLURALS)
    for plural in SHIPPED_PLURALS:
        for suffix in ("maximal", "minimal", "minimal-defaulted"):
            assert (TENSOR_FUSION_EXAMPLES / f"{plural}-{suffix}.yaml").is_file(), (plural, suffix)


@pytest.mark.parametrize("plural", SHIPPED_PLURALS)
def test_crd_keeps_every_field_of_a_maximal_tensor_fusion_object(plural):
    (crd,) = docs(MANIFESTS / "crds" / f"tensor-fusion.ai_{plural}.yaml")
    kind, scope = TENSOR_FUSION_KINDS[plural]
    assert crd["metadata"]["name"] == f"{plural}.tensor-fusion.ai"
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"], crd["spec"]["scope"]) == (
        "tensor-fusion.ai", kind, scope)
    (v,) = crd["spec"]["versions"]
    assert v["name"] == "v1" and v["served"] and v["storage"] and v["subresources"] == {"status": {}}
    (example,) = docs(TENSOR_FUSION_EXAMPLES / f"{plural}-maximal.yaml")
    assert example["kind"] == kind
    assert pruned_paths(example, _schema(crd)) == []


def test_crds_keep_the_fields_the_design_reads():
    def props(plural: str, *path: str) -> dict:
        (crd,) = docs(MANIFESTS / "crds" / f"tensor-fusion.ai_{plural}.yaml")
        node = _schema(crd)
        for p in path:
            node = node["properties"][p]
        return node["properties"]

    gpu = props("gpus", "status")
    for f in ("capacity", "gpuModel", "vendor", "index", "phase", "usedBy", "isolationMode", "nodeSelector"):
        assert f in gpu
    assert {"tflops", "vram"} <= set(gpu["capacity"]["properties"])
    pool = props("gpupools", "spec")
    assert {"schedulingConfigTemplate", "nodeManagerConfig", "capacityConfig"} <= set(pool)
    assert "provisioningMode" in pool["nodeManagerConfig"]["properties"]
    tmpl = props("schedulingconfigtemplates", "spec")
    assert "mode" in tmpl["placement"]["properties"] and "verticalScalingRules" in tmpl
    wp = props("workloadprofiles", "spec")
    for f in ("resources", "gpuCount", "isolation", "qos", "gpuModel", "autoScalingConfig"):
        assert f in wp
    assert "autoSetResources" in wp["autoScalingConfig"]["properties"]


def test_the_image_version_is_set_once_and_is_the_release() -> None:
    import tomllib

    root = ROOT
    release = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    kustomization = yaml.safe_load((root / "manifests" / "kustomization.yaml").read_text())
    assert kustomization["images"][0] == {"name": "tensor-fusion-extender", "newTag": release}
    assert [i["name"] for i in kustomization["images"]] == ["tensor-fusion-extender",
                                                            "registry.k8s.io/kube-scheduler"]
    chart = yaml.safe_load((root / "charts" / "tensor-fusion-extender" / "Chart.yaml").read_text())
    assert chart["appVersion"] == release
    for name in ("scheduler.yaml", "webhook.yaml"):  # no tag in the Deployments: kustomize sets it
        for doc in yaml.safe_load_all((root / "manifests" / name).read_text()):
            for container in ((doc or {}).get("spec", {}).get("template", {}).get("spec", {})
                              .get("containers", [])):
                if container["image"].startswith("tensor-fusion-extender"):
                    assert container["image"] == "tensor-fusion-extender"


def test_both_containers_have_liveness_probes_and_metrics_on_a_named_port() -> None:
    root = ROOT
    containers = {}
    for name in ("scheduler.yaml", "webhook.yaml"):
        for doc in yaml.safe_load_all((root / "manifests" / name).read_text()):
            if doc and doc["kind"] == "Deployment":
                for container in doc["spec"]["template"]["spec"]["containers"]:
                    containers[container["name"]] = container
    for name in ("kube-scheduler", "extender", "webhook"):
        assert "livenessProbe" in containers[name], name
    for name in ("extender", "webhook"):
        assert {"name": "metrics", "containerPort": 9090} in containers[name]["ports"]
        assert "--metrics-port=9090" in containers[name]["command"]
        assert containers[name]["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert "--bind-address=127.0.0.1" in containers["extender"]["command"]  # the verbs stay on loopback
