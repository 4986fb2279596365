"""The chart where platform teams run it: GKE's priority-class quota, an umbrella chart passing ``global``,
and an Argo CD-style render (``helm template``, no lookup) applied to a cluster; each ends in a working
install (the released processes run as in tests/e2e/test_helm_chart.py, see tests/harness/helm.py, and a
GPU pod is mutated by the installed webhook and placed through the installed extender). Before those, the
renders: pod-level overrides, the config checksum, the quota, gitops mode.

Each install gets a control plane of its own: the chart installs cluster-scoped objects.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests import harness as cpl
from tests.harness import helm as hc
from tests.harness.helm import CHART, NS, RELEASE, render, run

pytestmark = pytest.mark.e2e

SECRET = "tf-cloud-vendor-credentials"


@pytest.fixture(scope="module")
def helm(e2e_binaries) -> Path:
    return hc.helm_binary(e2e_binaries)


@pytest.fixture
def cluster(e2e_binaries, tmp_path, request):
    """A control plane of the test's own; ``request.param``: more kube-apiserver flags (a function of the
    workdir)."""
    extra = getattr(request, "param", None)
    cp = cpl.ControlPlane(tmp_path / "cp", e2e_binaries)
    if extra is not None:
        cp.apiserver_args = extra(tmp_path)
    started: list[cpl.ManagedProcess] = []
    try:
        cp.start()
        yield cp, started
    finally:
        for proc in reversed(started):
            proc.stop()
            cp.registry.forget(proc)
        cp.stop()


def _find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def _pod(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return _find(objs, "Deployment", name)["spec"]["template"]


def _containers(objs: list[dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _pod(objs, name)["spec"]["containers"]}


# ------------------------------------------------------------------------------------------- renders


def test_pod_level_overrides_reach_both_deployments(helm, tmp_path):
    values = tmp_path / "values.yaml"
    spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
               "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "tensor-fusion-webhook"}}}]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]}]}}}
    values.write_text(yaml.safe_dump({
        "priorityClass": {"name": "platform-critical"},
        "scheduler": {
            "podAnnotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
            "podLabels": {"team": "gpu"},
            "affinity": affinity,
            "podSecurityContext": {"fsGroup": 65532},
            "securityContext": {"readOnlyRootFilesystem": False},
            "extraEnv": [{"name": "GODEBUG", "value": "x509negativeserial=1"}],
            "extraVolumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}],
            "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/corp-ca"}],
            "resources": {"requests": {"cpu": "200m"}},
        },
        "extender": {
            "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
            "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": True}],
            "securityContext": {"runAsUser": 1001},
            "resources": {"requests": {"cpu": "300m"}},
        },
        "webhook": {
            "priorityClassName": "webhook-critical",
            "topologySpreadConstraints": spread,
            "podLabels": {"team": "gpu", "app.kubernetes.io/name": "ignored"},
            "extraEnv": [{"name": "TZ", "value": "UTC"}],
            "extraVolumes": [{"name": "tmp", "emptyDir": {}}],
            "extraVolumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            "resources": {"requests": {"cpu": "400m"}},
        },
    }))
    objs = render(helm, "-f", str(values))
    sched, web = _pod(objs, "tensor-fusion-scheduler"), _pod(objs, "tensor-fusion-webhook")
    assert sched["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert sched["metadata"]["labels"] == {"team": "gpu", "app.kubernetes.io/name": "tensor-fusion-scheduler",
                                           "app.kubernetes.io/part-of": "tensor-fusion-extender"}
    # the selector's label cannot be overridden (the Deployment would not own its pods)
    assert web["metadata"]["labels"]["app.kubernetes.io/name"] == "tensor-fusion-webhook"
    assert (sched["spec"]["priorityClassName"], web["spec"]["priorityClassName"]) == (
        "platform-critical", "webhook-critical")
    assert sched["spec"]["affinity"] == affinity  # replaces the default anti-affinity
    assert "podAntiAffinity" in web["spec"]["affinity"] and web["spec"]["topologySpreadConstraints"] == spread
    assert sched["spec"]["securityContext"] == {
        "fsGroup": 65532, "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"}}
    assert {"name": "ca", "configMap": {"name": "corp-ca"}} in sched["spec"]["volumes"]
    assert {"name": "tmp", "emptyDir": {}} in web["spec"]["volumes"]
    ks, ext = _containers(objs, "tensor-fusion-scheduler").values()
    assert ks["env"] == [{"name": "GODEBUG", "value": "x509negativeserial=1"}]
    assert ks["securityContext"]["readOnlyRootFilesystem"] is False
    assert ks["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "ca", "mountPath": "/etc/corp-ca"} in ks["volumeMounts"]
    assert ext["env"][-1] == {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}
    assert ext["env"][0]["name"] == "POD_NAMESPACE"  # the chart's own stays
    assert ext["securityContext"]["runAsUser"] == 1001 and ext["securityContext"]["readOnlyRootFilesystem"]
    assert {"name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": True} in ext["volumeMounts"]
    (webhook,) = _containers(objs, "tensor-fusion-webhook").values()
    assert webhook["env"] == [{"name": "TZ", "value": "UTC"}]
    assert {"name": "tmp", "mountPath": "/tmp"} in webhook["volumeMounts"]
    assert [c["resources"]["requests"]["cpu"] for c in (ks, ext, webhook)] == ["200m", "300m", "400m"]
    # no priority class at all
    none = render(helm, "--set", "priorityClass.name=")
    assert "priorityClassName" not in _pod(none, "tensor-fusion-scheduler")["spec"]


def test_a_changed_scheduler_configuration_rolls_kube_scheduler(helm):
    def checksum(*args: str) -> str:
        meta = _pod(render(helm, *args), "tensor-fusion-scheduler")["metadata"]
        return str(meta["annotations"]["checksum/config"])

    first = checksum()
    assert len(first) == 64 and checksum() == first
    assert checksum("--set", "scheduler.name=gpu-scheduler") != first  # the profile's name is in the file
    assert checksum("--set", "extender.maxPodsPerNode=64") == first  # a flag rolls it anyway (the command)
    assert "annotations" not in _pod(render(helm), "tensor-fusion-webhook")["metadata"]


def test_the_gke_quota_and_the_gitops_switches(helm):
    assert not [o for o in render(helm) if o["kind"] == "ResourceQuota"]
    quotas = render(helm, "--set", "priorityClass.resourceQuota=true")
    (quota,) = [o for o in quotas if o["kind"] == "ResourceQuota"]
    shipped = cpl.load_yaml_docs(cpl.MANIFESTS / "optional" / "gke" / "resourcequota.yaml")[0]
    assert quota == shipped  # as manifests/optional/gke/resourcequota.yaml
    quotas = render(helm, "--namespace", "gpu-system", "--set", "priorityClass.resourceQuota=true",
                    "--set", "priorityClass.quotaPods=8", "--set", "webhook.priorityClassName=mine")
    (other,) = [o for o in quotas if o["kind"] == "ResourceQuota"]
    assert other["metadata"]["namespace"] == "gpu-system" and other["spec"]["hard"] == {"pods": "8"}
    assert other["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == [
        "system-cluster-critical", "mine"]
    bad = run(helm, "template", RELEASE, CHART, "--set", "priorityClass.resourceQuota=true",
              "--set", "priorityClass.name=", check=False)
    assert bad.returncode != 0 and "priorityClass.resourceQuota needs priorityClass.name" in bad.stderr

    def kinds(*args: str) -> set[str]:
        return {o["kind"] for o in render(helm, *args)}

    defaults = {"TensorFusionCluster", "SchedulingConfigTemplate"}
    assert defaults <= kinds()
    assert not defaults & kinds("--set", "gitops.enabled=true")  # TensorFusion's chart may own them
    assert defaults <= kinds("--set", "gitops.enabled=true", "--set", "gitops.defaultObjects=true")
    # the NodeOverlay follows the API versions the tool passes, as the group version or the kind
    assert "NodeOverlay" in kinds("--set", "gitops.enabled=true",
                                  "--api-versions", "karpenter.sh/v1alpha1/NodeOverlay")
    assert "NodeOverlay" not in kinds("--set", "gitops.enabled=true")


def test_the_crd_upgrade_job_is_opt_in_and_may_touch_only_the_charts_crds(helm):
    assert not [o for o in render(helm) if o["metadata"]["name"] == "tensor-fusion-crds"]
    objs = [o for o in render(helm, "--set", "crds.upgradeJob=true")
            if o["metadata"]["name"] == "tensor-fusion-crds"]
    assert sorted(o["kind"] for o in objs) == ["ClusterRole", "ClusterRoleBinding", "Job", "ServiceAccount"]
    assert all(o["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade" for o in objs)
    job = _find(objs, "Job", "tensor-fusion-crds")["spec"]["template"]["spec"]
    assert job["containers"][0]["command"] == ["tf-extender", "crds", "apply"]  # the CRDs the image ships
    rules = _find(objs, "ClusterRole", "tensor-fusion-crds")["rules"]
    shipped = sorted(yaml.safe_load(p.read_text())["metadata"]["name"]
                     for p in (CHART / "crds").glob("*.yaml"))
    assert rules[1]["resourceNames"] == shipped and rules[0] == {
        "apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
        "verbs": ["create"]}


# ------------------------------------------------------------------------------------------- installs


def _umbrella(tmp_path: Path) -> Path:
    """A platform team's umbrella chart: this chart as a dependency, and global values for all of them."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    root = tmp_path / "platform"
    shutil.copytree(CHART, root / "charts" / "tensor-fusion-extender")
    (root / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "platform", "version": "1.0.0",
        "dependencies": [{"name": "tensor-fusion-extender", "version": chart["version"],
                          "repository": f"file://{CHART}"}],
    }))
    (root / "values.yaml").write_text(yaml.safe_dump({
        "global": {"imageRegistry": "registry.example", "imagePullSecrets": [{"name": "regcred"}],
                   "storageClass": "fast"},
        "tensor-fusion-extender": {"scheduler": {"podLabels": {"team": "platform"}}},
    }))
    return root


def _apply_render(cp: cpl.ControlPlane, objs: list[dict[str, Any]], manager: str) -> list[dict[str, Any]]:
    """What Argo CD and Flux's kustomize-controller do with a render: CRDs first, then the rest (hooks
    aside: run_hook runs them), server-side applied."""
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    hc.apply_objects(cp, crds, manager)
    ext = client.ApiextensionsV1Api(cp.api_client())
    for crd in crds:
        cpl.wait_until(lambda name=crd["metadata"]["name"]: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(name).status.conditions or []), 30,
            what=f"CRD {crd['metadata']['name']} established")
    core = client.CoreV1Api(cp.api_client())
    try:
        core.create_namespace({"metadata": {"name": NS}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    rest = [o for o in objs if o["kind"] != "CustomResourceDefinition" and not hc.is_hook(o)]
    hc.apply_objects(cp, rest, manager)
    hc.run_hook(cp, [o for o in objs if hc.is_hook(o)])
    return rest


def test_as_a_dependency_with_global_values_installs_and_schedules(helm, cluster, e2e_binaries, tmp_path):
    cp, started = cluster
    umbrella = _umbrella(tmp_path)
    objs = render(helm, "--include-crds", chart=umbrella, release="platform")
    # the subchart's objects are its own render with the parent's values for it
    alone = render(helm, "--include-crds", "--set", "scheduler.podLabels.team=platform", release="platform")
    assert sorted(map(str, objs)) == sorted(map(str, alone))
    sched = _pod(objs, "tensor-fusion-scheduler")
    assert sched["metadata"]["labels"]["team"] == "platform"
    installed = _apply_render(cp, objs, "platform-gitops")
    hc.start_release(cp, started, installed, e2e_binaries, prefix="umbrella")
    hc.schedule_a_gpu_pod(cp)
    # as the release's own install: the Secret TensorFusion's guide patches is there, keys empty
    secret = client.CoreV1Api(cp.api_client()).read_namespaced_secret(SECRET, NS)
    assert secret.data == {"ak": "", "sk": ""} or secret.data is None


def test_argo_cd_style_render_without_lookups_keeps_what_the_cluster_has(helm, cluster, e2e_binaries):
    """gitops.enabled: the cluster has Karpenter's NodeOverlay API and a credentials Secret made by hand. The
    render (API versions passed as Argo CD does, no lookup) has the NodeOverlay and not TensorFusion's default
    objects (their owner may be TensorFusion's chart); applied, and applied again after the guide's patch, it
    leaves the Secret's keys alone; and the install works."""
    cp, started = cluster
    api = cp.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    cpl.apply_crds(api, [Path(e2e_binaries["karpenter-crds"]) / "karpenter.sh_nodeoverlays.yaml"])
    core.create_namespace({"metadata": {"name": NS}})
    core.create_namespaced_secret(NS, {"metadata": {"name": SECRET},
                                       "stringData": {"ak": "AKIA-HAND", "sk": "s"}})
    objs = render(helm, "--include-crds", "--set", "gitops.enabled=true",
                  "--api-versions", "karpenter.sh/v1alpha1/NodeOverlay")
    kinds = {o["kind"] for o in objs}
    assert "NodeOverlay" in kinds and not kinds & {"TensorFusionCluster", "SchedulingConfigTemplate"}
    installed = _apply_render(cp, objs, "argocd-controller")
    hc.start_release(cp, started, installed, e2e_binaries, prefix="argo")
    hc.schedule_a_gpu_pod(cp)

    def keys() -> dict[str, str]:
        data = core.read_namespaced_secret(SECRET, NS).data or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    assert keys() == {"ak": "AKIA-HAND", "sk": "s"}
    # TensorFusion's guide step, then the next sync
    core.patch_namespaced_secret(SECRET, NS, {"stringData": {"ak": "AKIA-PATCHED"}})
    hc.apply_objects(cp, [o for o in installed if o["kind"] == "Secret"], "argocd-controller")
    assert keys() == {"ak": "AKIA-PATCHED", "sk": "s"}
    overlay = custom.get_cluster_custom_object("karpenter.sh", "v1alpha1", "nodeoverlays",
                                               "tensor-fusion-overlay")
    assert len(overlay["spec"]["capacity"]) == 16


GKE_ADMISSION = {
    "apiVersion": "apiserver.config.k8s.io/v1",
    "kind": "AdmissionConfiguration",
    "plugins": [{
        "name": "ResourceQuota",
        "configuration": {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "ResourceQuotaConfiguration",
            "limitedResources": [{"resource": "pods", "matchScopes": [{
                "scopeName": "PriorityClass", "operator": "In",
                "values": ["system-node-critical", "system-cluster-critical"]}]}],
        },
    }],
}


def _gke_admission(workdir: Path) -> list[str]:
    """GKE's rule: pods of the system-* priority classes need a quota that covers them."""
    path = workdir / "gke-admission.yaml"
    path.write_text(yaml.safe_dump(GKE_ADMISSION))
    return [f"--admission-control-config-file={path}"]


@pytest.mark.parametrize("cluster", [_gke_admission], indirect=True)
def test_on_gke_the_quota_value_lets_the_pods_in(helm, cluster, e2e_binaries):
    cp, started = cluster
    kc = cp.kubeconfig
    api = cp.api_client()
    core = client.CoreV1Api(api)
    started.append(cpl.start_controller_manager(
        cp, e2e_binaries["kube-controller-manager"],
        ("replicaset-controller", "deployment-controller", "resourcequota-controller")))

    def pods(name: str) -> int:
        return len(core.list_namespaced_pod(NS, label_selector=f"app.kubernetes.io/name={name}").items)

    def refused() -> str:
        events = core.list_namespaced_event(NS, field_selector="reason=FailedCreate").items
        return next((e.message for e in events if "insufficient quota" in (e.message or "")), "")

    out = run(helm, "install", RELEASE, CHART, "--namespace", NS, "--create-namespace", "--no-hooks",
              kubeconfig=kc)
    notes = out.stdout.split("NOTES:")[-1]  # nothing to install that is not published; the guide's patch
    assert "pipx" not in notes and "patch secret tf-cloud-vendor-credentials" in notes
    assert "image.repository is the bare name tensor-fusion-extender, which resolves to no published" in notes
    message = cpl.wait_until(refused, 60, what="GKE's quota rule to refuse the chart's pods")
    assert "insufficient quota to match these scopes" in message
    assert pods("tensor-fusion-scheduler") == 0

    out = run(helm, "upgrade", RELEASE, CHART, "--namespace", NS, "--no-hooks",
              "--set", "priorityClass.resourceQuota=true", kubeconfig=kc)
    assert "STATUS: deployed" in out.stdout
    cpl.wait_until(lambda: pods("tensor-fusion-scheduler") == 2 and pods("tensor-fusion-webhook") == 2, 90,
                   what="the ReplicaSets to create their pods once the quota is there")
    quota = core.read_namespaced_resource_quota("tensor-fusion-critical-pods", NS)
    cpl.wait_until(lambda: core.read_namespaced_resource_quota(
        "tensor-fusion-critical-pods", NS).status.used.get("pods") == "4", 30, what="the quota to count them")
    assert quota.spec.scope_selector.match_expressions[0].values == ["system-cluster-critical"]

    installed = [d for d in yaml.safe_load_all(
        run(helm, "get", "manifest", RELEASE, "--namespace", NS, kubeconfig=kc).stdout) if d]
    hc.run_hook(cp, hc.hook_objects(helm, kc))
    hc.start_release(cp, started, installed, e2e_binaries, prefix="gke")
    hc.schedule_a_gpu_pod(cp)

    # TensorFusion's guide: "on an existing install update the Secret directly" (kubectl patch secret)
    assert core.read_namespaced_secret(SECRET, NS).data == {"ak": "", "sk": ""}
    core.patch_namespaced_secret(SECRET, NS, {"stringData": {"ak": "AKIA-GUIDE", "sk": "guide-secret"}})
    hc.webhook_back_to_service(cp)
    out = run(helm, "upgrade", RELEASE, CHART, "--namespace", NS, "--no-hooks", "--reset-then-reuse-values",
              "--set", "crds.upgradeJob=true", kubeconfig=kc)
    assert "STATUS: deployed" in out.stdout
    # the pre-upgrade CRD Job, as its ServiceAccount (the hook's RBAC is all it may use): every CRD is the
    # release's own, so each is updated or left unchanged, none refused
    applied = hc.run_hook(cp, hc.hook_objects(helm, kc), job_name="tensor-fusion-crds")
    assert "gpus.tensor-fusion.ai: unchanged" in applied and "refuse" not in applied, applied
    data = core.read_namespaced_secret(SECRET, NS).data
    assert {k: base64.b64decode(v).decode() for k, v in data.items()} == {"ak": "AKIA-GUIDE",
                                                                          "sk": "guide-secret"}
