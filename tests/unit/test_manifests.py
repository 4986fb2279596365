"""Static checks of manifests/ (no cluster needed). The server-side dry run of every manifest against a
real API server is in tests/e2e/test_manifests.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
UPSTREAM = ROOT.parent / "shared" / "testdata" / "tensor-fusion"
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
        and "scheduler" not in p.parent.parts[-1:]
    }
    assert on_disk == listed
    gen = k["configMapGenerator"][0]
    assert gen["name"] == "tensor-fusion-scheduler-config"
    assert gen["files"] == ["kube-scheduler-config.yaml=scheduler/kube-scheduler-config.yaml"]
    opt = yaml.safe_load((MANIFESTS / "optional" / "kustomization.yaml").read_text())
    assert opt["resources"] == ["karpenter-nodeoverlay.yaml"]


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
    assert ext["nodeCacheCapable"] is True and ext["enableHTTPS"] is False and ext["httpTimeout"] == "5s"
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
    assert sched["image"] == "registry.k8s.io/kube-scheduler:v1.36.3"
    assert extender["image"] == "tensor-fusion-extender:latest"
    assert extender["command"][:2] == ["tf-extender", "serve"]
    assert "--port=8080" in extender["command"] and "--bind-address=127.0.0.1" in extender["command"]
    assert "ports" not in extender  # loopback only
    assert spec["serviceAccountName"] == "tensor-fusion-scheduler"
    assert spec["volumes"] == [{"name": "config", "configMap": {"name": "tensor-fusion-scheduler-config"}}]


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
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["tensor-fusion-system"]}
        ]
    }
    dep = find("Deployment", "tensor-fusion-webhook")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "tf-webhook",
        "serve",
        "--port=9443",
        "--cert-dir=/certs",
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


def test_rbac_is_least_privilege():
    for role in ("tensor-fusion-extender", "tensor-fusion-webhook"):
        for r in _rules(role):
            assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"]
            assert "secrets" not in r["resources"]
            assert not {"delete", "deletecollection", "update", "escalate", "bind", "impersonate"} & set(
                r["verbs"]
            )
    for r in _rules("tensor-fusion-webhook"):
        assert set(r["verbs"]) <= {"get", "list", "watch"}
    granted = {
        (g, res, v)
        for r in _rules("tensor-fusion-extender")
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
    ):
        assert (role, "tensor-fusion-scheduler") in bound
    assert ("tensor-fusion-webhook", "tensor-fusion-webhook") in bound


def test_nodeoverlay_declares_every_index_resource():
    (ov,) = docs(MANIFESTS / "optional" / "karpenter-nodeoverlay.yaml")
    assert ov["apiVersion"] == "karpenter.sh/v1alpha1" and ov["kind"] == "NodeOverlay"
    assert sorted(ov["spec"]["capacity"]) == INDEX_NAMES
    # every node must admit the worst case: max pods all in one index group with quantity 8
    assert all(int(v) >= 8 * 110 for v in ov["spec"]["capacity"].values())
    assert ov["spec"]["requirements"]


# ---------------------------------------------------------------------- CRDs vs upstream, statically


def _schema(crd: dict) -> dict:
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v["schema"]["openAPIV3Schema"]


def _compatible(ours: dict, up: dict, path: str, problems: list[str]) -> None:
    """ours accepts (and keeps) everything up accepts: same types, no extra required fields, no narrower
    enums, and unknown fields preserved wherever upstream declares fields we do not."""
    if ours.get("x-kubernetes-int-or-string") or up.get("x-kubernetes-int-or-string"):
        if ours.get("x-kubernetes-int-or-string") != up.get("x-kubernetes-int-or-string"):
            problems.append(f"{path}: int-or-string differs")
        return
    if ours.get("type") != up.get("type"):
        problems.append(f"{path}: type {ours.get('type')} != upstream {up.get('type')}")
        return
    if set(ours.get("required", [])) - set(up.get("required", [])):
        problems.append(f"{path}: requires more than upstream")
    if ours.get("enum") and set(up.get("enum") or []) - set(ours["enum"]):
        problems.append(f"{path}: enum narrower than upstream")
    for key in ("minimum", "maximum", "pattern", "maxLength", "minLength", "x-kubernetes-validations"):
        if key in ours and ours[key] != up.get(key):
            problems.append(f"{path}: {key} differs from upstream")
    ours_props, up_props = ours.get("properties") or {}, up.get("properties") or {}
    for k, v in ours_props.items():
        if k not in up_props:
            problems.append(f"{path}.{k}: not in upstream")
        else:
            _compatible(v, up_props[k], f"{path}.{k}", problems)
    if (
        set(up_props) - set(ours_props)
        and path != ""
        and not ours.get("x-kubernetes-preserve-unknown-fields")
    ):
        problems.append(f"{path}: upstream fields {sorted(set(up_props) - set(ours_props))} would be pruned")
    if up.get("x-kubernetes-preserve-unknown-fields") and not ours.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        problems.append(f"{path}: upstream preserves unknown fields")
    if ours.get("type") == "array":
        _compatible(ours.get("items", {}), up.get("items", {}), path + "[]", problems)
    if isinstance(up.get("additionalProperties"), dict):
        if not isinstance(ours.get("additionalProperties"), dict) and not ours.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            problems.append(f"{path}: map values would be pruned")
        elif isinstance(ours.get("additionalProperties"), dict):
            _compatible(ours["additionalProperties"], up["additionalProperties"], path + "{}", problems)


@pytest.mark.parametrize("plural", ["gpus", "gpupools", "schedulingconfigtemplates", "workloadprofiles"])
def test_crd_is_a_compatible_subset_of_upstream(plural):
    (ours,) = docs(MANIFESTS / "crds" / f"tensor-fusion.ai_{plural}.yaml")
    (up,) = docs(UPSTREAM / f"tensor-fusion.ai_{plural}.yaml")
    assert ours["metadata"]["name"] == up["metadata"]["name"]
    assert ours["spec"]["names"] == {
        k: v for k, v in up["spec"]["names"].items() if k in ours["spec"]["names"]
    }
    assert ours["spec"]["scope"] == up["spec"]["scope"]
    (v,) = ours["spec"]["versions"]
    assert v["name"] == "v1" and v["served"] and v["storage"] and v["subresources"] == {"status": {}}
    problems: list[str] = []
    _compatible(_schema(ours), _schema(up), "", problems)
    assert not problems, "\n".join(problems)


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
