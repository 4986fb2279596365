"""The Helm chart (charts/tensor-fusion-extender), with helm v3 built from the Go module proxy.

What each test proves:

- ``helm lint --strict`` passes, for the defaults and for every TLS mode.
- With default values, ``helm template`` renders exactly the objects of manifests/ (minus the Namespace,
  which ``helm install --create-namespace`` makes) and of manifests/defaults/ (TensorFusion's default
  TensorFusionCluster and SchedulingConfigTemplate) plus the TLS hook objects; with the Prometheus Operator
  API and the switches on, exactly those of manifests/optional/monitoring/ and the Karpenter NodeOverlay.
  A difference is reported object by object and field by field.
- The default objects carry TensorFusion's names and ``helm.sh/resource-policy: keep``, values rename or
  disable each, and a bad value or two default pools fail the render with the value named.
- Values reach the objects: image, replicas, resources, scheduler name, extender and expansion flags, the
  GPU-status switch, TLS modes, the default pool; every rendered command line is accepted by our own CLIs.
- On a control plane of its own (the chart installs cluster-scoped objects the other modules also create),
  a real ``helm install`` / ``helm upgrade`` / ``helm uninstall``, and in between a GPU pod is scheduled
  through what the chart installed. There are no kubelets here, so Deployments and hook Jobs cannot run as
  pods: ``--no-hooks`` is used and the test runs, as local processes the way the e2e harness does, the
  exact command lines of the installed hook Job and Deployments, each with the kubeconfig of the
  ServiceAccount the chart gave it (so the chart's RBAC is what authorises them), and the scheduler with
  the installed ConfigMap's KubeSchedulerConfiguration. Karpenter's NodeOverlay CRD is installed first, so
  the chart's ``lookup`` finds it and creates ``tensor-fusion-overlay``; the default objects outlive
  ``helm uninstall``. Two substitutions, because there is no Service
  network: the webhook serves on a loopback port with a loopback certificate, and the installed
  MutatingWebhookConfiguration's clientConfig is switched from the Service to that URL (its rules,
  selectors and policies stay as installed).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests import harness as cpl
from tests.harness import helm as helm_chart
from tests.harness.helm import CHART, NS, RELEASE, render
from tests.harness.helm import hook_objects as _hook_objects
from tests.harness.helm import is_hook as _is_hook
from tests.harness.helm import run as _run
from tests.harness.helm import run_hook as _run_hook

pytestmark = pytest.mark.e2e

KUBE_VERSION = cpl.KUBE_VERSION  # helm template/lint render for it, as helm install does for its cluster


@pytest.fixture(scope="module")
def helm(e2e_binaries) -> Path:
    return helm_chart.helm_binary(e2e_binaries)


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']}/{meta.get('namespace', '') + '/' if meta.get('namespace') else ''}{meta['name']}"


def field_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Every place where ``a`` (manifests) and ``b`` (chart) differ, as ``path: manifests=.. chart=..``."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in b:
                out.append(f"{sub}: only in manifests ({json.dumps(a[k])[:120]})")
            elif k not in a:
                out.append(f"{sub}: only in the chart ({json.dumps(b[k])[:120]})")
            else:
                out += field_diff(a[k], b[k], sub)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in field_diff(x, y, f"{path}[{i}]")
        ]
    if a != b:
        return [f"{path}: manifests={json.dumps(a)[:200]} chart={json.dumps(b)[:200]}"]
    return []


def assert_same_objects(manifests: list[dict[str, Any]], chart: list[dict[str, Any]]) -> None:
    ours = {_key(o): o for o in manifests}
    theirs = {_key(o): o for o in chart}
    problems = [f"{k}: in manifests/, not rendered by the chart" for k in sorted(ours.keys() - theirs.keys())]
    problems += [
        f"{k}: rendered by the chart, not in manifests/" for k in sorted(theirs.keys() - ours.keys())
    ]
    for k in sorted(ours.keys() & theirs.keys()):
        problems += [f"{k}: {d}" for d in field_diff(ours[k], theirs[k])]
    assert not problems, "chart and manifests differ:\n" + "\n".join(problems)


def _find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def _container(objs: list[dict[str, Any]], kind: str, name: str, container: str) -> dict[str, Any]:
    spec = _find(objs, kind, name)["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == container)


# ------------------------------------------------------------------------------------ render and lint


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["--set", "tls.mode=secret"],
        ["--set", "tls.mode=cert-manager"],
        ["--set", "placement.defaultPool.create=true", "--set", "cluster.enabled=false"],
        ["--set", "karpenter.nodeOverlay=true"],
        ["--set", "gitops.enabled=true", "--set", "gitops.defaultObjects=true"],
        ["--set", "priorityClass.resourceQuota=true", "--set", "crds.upgradeJob=true",
         "--set", "global.imageRegistry=registry.example"],
    ],
)
def test_lint(helm, values):
    out = _run(helm, "lint", "--strict", CHART, "--namespace", NS, *values)
    assert "0 chart(s) failed" in out.stdout


def _as_manifests(chart: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The two deliberate differences taken out: the scheduler pod's checksum/config annotation (a changed
    configuration rolls kube-scheduler; the manifests' fixed ConfigMap needs a restart) and the Secret's empty
    keys (Helm writes it once; manifests/ are applied again and again, so theirs has no keys to overwrite)."""
    out = []
    for obj in chart:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "tensor-fusion-scheduler":
            meta = obj["spec"]["template"]["metadata"]
            assert set(meta.pop("annotations")) == {"checksum/config"}
        if obj["kind"] == "Secret" and obj["metadata"]["name"] == VENDOR_SECRET:
            assert obj.pop("data") == {"ak": "", "sk": ""}
            del obj["metadata"]["annotations"]["helm.sh/resource-policy"]
            if not obj["metadata"]["annotations"]:
                del obj["metadata"]["annotations"]
        out.append(obj)
    return out


def test_default_render_is_manifests_plus_the_tls_hook(helm):
    chart = _as_manifests(render(helm, "--include-crds"))
    manifests = [o for o in cpl.render_kustomization(cpl.MANIFESTS) if o["kind"] != "Namespace"]
    manifests += cpl.render_kustomization(cpl.MANIFESTS / "defaults")
    manifests += cpl.render_kustomization(cpl.CRDS_DIR)  # the chart's crds/: manifests/crds, kept apart
    assert_same_objects(manifests, [o for o in chart if not _is_hook(o)])
    hooks = sorted(_key(o) for o in chart if _is_hook(o))
    assert hooks == [
        "ClusterRole/tensor-fusion-certs",
        "ClusterRoleBinding/tensor-fusion-certs",
        f"Job/{NS}/tensor-fusion-certs",
        f"Role/{NS}/tensor-fusion-certs",
        f"RoleBinding/{NS}/tensor-fusion-certs",
        f"ServiceAccount/{NS}/tensor-fusion-certs",
    ]


def test_optional_objects_render_as_in_manifests_optional(helm):
    chart = render(
        helm,
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--set",
        "monitoring.grafanaDashboard=true",
        "--set",
        "karpenter.nodeOverlay=true",
    )
    extra = [
        o
        for o in chart
        if o["kind"] in ("PodMonitor", "PrometheusRule", "NodeOverlay")
        or o["metadata"]["name"] == "tensor-fusion-extender-dashboard"
    ]
    optional = cpl.render_kustomization(cpl.MANIFESTS / "optional" / "monitoring")
    optional += cpl.load_yaml_docs(cpl.MANIFESTS / "optional" / "karpenter-nodeoverlay.yaml")
    assert_same_objects(optional, extra)
    # off by default, and "auto" follows the cluster's APIs
    assert not [o for o in render(helm) if o["kind"] in ("PodMonitor", "PrometheusRule", "NodeOverlay")]
    auto = render(helm, "--api-versions", "karpenter.sh/v1alpha1")  # auto is the default
    assert [_key(o) for o in auto if o["kind"] == "NodeOverlay"] == ["NodeOverlay/tensor-fusion-overlay"]
    assert not [o for o in render(helm, "--api-versions", "karpenter.sh/v1alpha1", "--set",
                                  "karpenter.nodeOverlay=false") if o["kind"] == "NodeOverlay"]
    earlier = '[{"key":"tensor-fusion.ai/gpu-node","operator":"In","values":["true"]}]'
    renamed = render(
        helm,
        "--set", "karpenter.nodeOverlay=true",
        "--set", "karpenter.nodeOverlayName=tensor-fusion-index-resources",
        "--set-json", f"karpenter.nodeOverlayRequirements={earlier}",
    )
    (ov,) = [o for o in renamed if o["kind"] == "NodeOverlay"]
    assert ov["metadata"]["name"] == "tensor-fusion-index-resources"  # the earlier name and selector
    assert ov["spec"]["requirements"] == [
        {"key": "tensor-fusion.ai/gpu-node", "operator": "In", "values": ["true"]}
    ]


def _parse(parser: argparse.ArgumentParser, command: list[str]) -> argparse.Namespace:
    return parser.parse_args(command[1:])


def test_values_reach_the_objects_and_every_command_line_is_valid(helm):
    from certs import cli as certs_cli
    from extender import cli as extender_cli
    from webhook import cli as webhook_cli

    objs = render(
        helm,
        "--set",
        "image.repository=registry.example/tfe",
        "--set",
        "image.tag=1.2.3",
        "--set",
        "scheduler.replicas=3",
        "--set",
        "webhook.replicas=4",
        "--set",
        "scheduler.name=gpu-scheduler",
        "--set",
        "extender.maxPodsPerNode=64",
        "--set",
        "extender.inventorySource=node-labels",
        "--set",
        "extender.preemptor=false",
        "--set",
        "extender.gpuStatusInterval=2s",
        "--set",
        "expansion.maxInflightNodes=3",
        "--set",
        "expansion.delay=5s",
        "--set",
        "expansion.claimTimeout=1m",
        "--set",
        "extender.resources.limits.memory=3Gi",
        "--set",
        "webhook.requestTimeout=4s",
    )
    ext = _container(objs, "Deployment", "tensor-fusion-scheduler", "extender")
    hook = _container(objs, "Job", "tensor-fusion-certs", "tf-certs")
    web = _container(objs, "Deployment", "tensor-fusion-webhook", "webhook")
    assert {ext["image"], web["image"], hook["image"]} == {"registry.example/tfe:1.2.3"}
    assert _find(objs, "Deployment", "tensor-fusion-scheduler")["spec"]["replicas"] == 3
    assert _find(objs, "Deployment", "tensor-fusion-webhook")["spec"]["replicas"] == 4
    assert ext["resources"]["limits"]["memory"] == "3Gi"
    args = _parse(extender_cli.build_parser(), ext["command"])
    assert (
        args.max_pods_per_node,
        args.inventory_source,
        args.preemptor,
        args.write_gpu_status,
        args.gpu_status_interval,
    ) == (64, "node-labels", False, True, 2.0)
    assert (args.max_inflight_nodes, args.expansion_delay, args.expansion_claim_timeout) == (3, 5.0, 60.0)
    web_args = _parse(webhook_cli.build_parser(), web["command"])
    assert (web_args.scheduler_name, web_args.request_timeout) == ("gpu-scheduler", 4.0)
    certs_args = _parse(certs_cli.build_parser(), hook["command"])
    assert certs_args.dns == [
        f"tensor-fusion-webhook.{NS}.svc",
        f"tensor-fusion-webhook.{NS}.svc.cluster.local",
    ]
    config = yaml.safe_load(
        _find(objs, "ConfigMap", "tensor-fusion-scheduler-config")["data"]["kube-scheduler-config.yaml"]
    )
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpu-scheduler"]
    assert config["leaderElection"]["resourceNamespace"] == NS

    off = render(helm, "--set", "expansion.enabled=false", "--set", "extender.writeGpuStatus=false")
    args = _parse(
        extender_cli.build_parser(),
        _container(off, "Deployment", "tensor-fusion-scheduler", "extender")["command"],
    )
    assert (args.expansion_enabled, args.write_gpu_status) == (False, False)
    # auto: TensorFusion's own controller (GPUNode API served) owns GPU status
    tf = render(helm, "--api-versions", "tensor-fusion.ai/v1/TensorFusionConnection")
    assert (
        "--write-gpu-status"
        not in _container(tf, "Deployment", "tensor-fusion-scheduler", "extender")["command"]
    )
    # and its controllers own TensorFusionClusters' pools and the GPUNodes
    tf_args = _parse(extender_cli.build_parser(),
                     _container(tf, "Deployment", "tensor-fusion-scheduler", "extender")["command"])
    assert (tf_args.tfcluster_enabled, tf_args.gpu_nodes_enabled) == (False, False)
    assert (args.tfcluster_enabled, args.gpu_nodes_enabled) == (True, True)


def test_tls_modes(helm):
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n").decode()
    secret = render(
        helm, "--set", "tls.mode=secret", "--set", "tls.secretName=mine", "--set", f"tls.caBundle={ca}"
    )
    assert not [o for o in secret if _is_hook(o)]
    web = _find(secret, "MutatingWebhookConfiguration", "tensor-fusion-webhook")
    assert web["webhooks"][0]["clientConfig"]["caBundle"] == ca
    volumes = _find(secret, "Deployment", "tensor-fusion-webhook")["spec"]["template"]["spec"]["volumes"]
    assert volumes == [{"name": "certs", "secret": {"secretName": "mine"}}]

    for args in (["--set", "tls.mode=cert-manager"], ["--api-versions", "cert-manager.io/v1"]):
        cm = render(helm, *args)
        assert sorted(_key(o) for o in cm if o["kind"] in ("Issuer", "Certificate")) == [
            f"Certificate/{NS}/tensor-fusion-webhook",
            f"Certificate/{NS}/tensor-fusion-webhook-ca",
            f"Issuer/{NS}/tensor-fusion-ca",
            f"Issuer/{NS}/tensor-fusion-selfsigned",
        ]
        web = _find(cm, "MutatingWebhookConfiguration", "tensor-fusion-webhook")
        assert web["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NS}/tensor-fusion-webhook"
        }
        assert not [o for o in cm if _is_hook(o)]
    bad = _run(helm, "template", RELEASE, CHART, "--set", "tls.mode=magic", check=False)
    assert bad.returncode != 0 and "at '/tls/mode': value must be one of 'auto', 'hook'" in bad.stderr


KEEP = {"helm.sh/resource-policy": "keep"}


def test_tensorfusion_default_objects(helm):
    objs = render(helm)
    sct = _find(objs, "SchedulingConfigTemplate", "tf-scheduling-config")
    assert sct["spec"] == {"placement": {"mode": "NodeCompactGPULowLoad"}}
    tfc = _find(objs, "TensorFusionCluster", "tensor-fusion")
    for obj in (sct, tfc):
        assert obj["metadata"]["annotations"] == KEEP
    (pool,) = tfc["spec"]["gpuPools"]
    assert (pool["name"], pool["isDefault"]) == ("shared", True)
    template = pool["specTemplate"]
    assert template["schedulingConfigTemplate"] == "tf-scheduling-config"
    assert template["nodeManagerConfig"]["provisioningMode"] == "AutoSelect"
    assert template["capacityConfig"]["minResources"] == {"tflops": "20", "vram": "10Gi"}
    assert not [o for o in objs if o["kind"] == "GPUPool"]  # the pool is derived from the cluster

    changed = render(
        helm,
        "--set", "cluster.name=gpus",
        "--set", "cluster.pool.name=inference",
        "--set", "cluster.pool.nodeSelectorKey=example.com/gpu",
        "--set", "cluster.pool.provisioningMode=Karpenter",
        "--set-string", "cluster.pool.capacityConfig.minResources.tflops=0",
        "--set", "schedulingConfigTemplate.name=placement",
        "--set", "schedulingConfigTemplate.placementMode=CompactFirst",
    )
    (pool,) = _find(changed, "TensorFusionCluster", "gpus")["spec"]["gpuPools"]
    assert pool["name"] == "inference"
    assert pool["specTemplate"]["schedulingConfigTemplate"] == "placement"
    assert pool["specTemplate"]["nodeManagerConfig"]["provisioningMode"] == "Karpenter"
    assert pool["specTemplate"]["capacityConfig"]["minResources"]["tflops"] == "0"
    (term,) = pool["specTemplate"]["nodeManagerConfig"]["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "example.com/gpu", "operator": "In", "values": ["true"]}]
    placement = _find(changed, "SchedulingConfigTemplate", "placement")["spec"]["placement"]
    assert placement["mode"] == "CompactFirst"

    off = render(helm, "--set", "cluster.enabled=false", "--set", "schedulingConfigTemplate.enabled=false")
    assert not [o for o in off if o["kind"] in ("TensorFusionCluster", "SchedulingConfigTemplate")]
    no_sct = render(helm, "--set", "schedulingConfigTemplate.enabled=false")
    (pool,) = _find(no_sct, "TensorFusionCluster", "tensor-fusion")["spec"]["gpuPools"]
    assert "schedulingConfigTemplate" not in pool["specTemplate"]  # no reference to an object not made

    bad = _run(helm, "template", RELEASE, CHART, "--set", "schedulingConfigTemplate.placementMode=Fastest",
               check=False)
    assert bad.returncode != 0
    assert 'schedulingConfigTemplate.placementMode "Fastest": use CompactFirst' in bad.stderr
    mode = _run(helm, "template", RELEASE, CHART, "--set", "cluster.pool.provisioningMode=Manual",
                check=False)
    assert mode.returncode != 0
    assert 'cluster.pool.provisioningMode "Manual": use AutoSelect, Karpenter or Provisioned' in mode.stderr
    name = _run(helm, "template", RELEASE, CHART, "--set", "cluster.pool.name=GPU_Pool", check=False)
    assert name.returncode != 0
    assert 'cluster.pool.name "GPU_Pool": the derived GPUPool tensor-fusion-GPU_Pool must be a DNS label' in (
        name.stderr
    )
    both = _run(helm, "template", RELEASE, CHART, "--set", "placement.defaultPool.create=true", check=False)
    assert both.returncode != 0
    assert "placement.defaultPool.create=true and cluster.enabled=true would make two default pools" in (
        both.stderr
    )


VENDOR_SECRET = "tf-cloud-vendor-credentials"
VENDOR_KEYS = ("--set", "cloudVendorCredentials.accessKey=AKIA-INSTALL",
               "--set", "cloudVendorCredentials.secretKey=secret-install")


def test_cloud_vendor_credentials_secret_and_mount(helm):
    """TensorFusion's Secret (ak, sk) in every install, empty keys unless given (so TensorFusion's guide can
    patch it), never "dummy"; mounted read-only and optional into the extender, at /tmp/secret unless told.
    Under gitops.enabled it has no keys unless given, so applying it again keeps keys set in the cluster."""
    defaults = render(helm)
    empty = _find(defaults, "Secret", VENDOR_SECRET)
    assert empty["data"] == {"ak": "", "sk": ""}
    assert empty["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "data" not in _find(render(helm, "--set", "gitops.enabled=true"), "Secret", VENDOR_SECRET)
    given = _find(render(helm, "--set", "gitops.enabled=true", *VENDOR_KEYS), "Secret", VENDOR_SECRET)
    assert {k: base64.b64decode(v).decode() for k, v in given["data"].items()} == {
        "ak": "AKIA-INSTALL", "sk": "secret-install"}
    ext = _container(defaults, "Deployment", "tensor-fusion-scheduler", "extender")
    assert {"name": "cloud-vendor-credentials", "mountPath": "/tmp/secret", "readOnly": True} in ext[
        "volumeMounts"]
    pod = _find(defaults, "Deployment", "tensor-fusion-scheduler")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "cloud-vendor-credentials")
    assert volume["secret"] == {"secretName": VENDOR_SECRET, "optional": True}
    scheduler = _container(defaults, "Deployment", "tensor-fusion-scheduler", "kube-scheduler")
    assert all(m["name"] != "cloud-vendor-credentials" for m in scheduler.get("volumeMounts") or []), (
        "only the extender runs the capacity controllers")

    objs = render(helm, *VENDOR_KEYS, "--set", "cloudVendorCredentials.mountPath=/etc/cloud",
                  "--set", "capacity.cloudKeyDir=/etc/cloud")
    secret = _find(objs, "Secret", VENDOR_SECRET)
    assert secret["metadata"]["namespace"] == NS
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "ak": "AKIA-INSTALL", "sk": "secret-install"}
    mounts = _container(objs, "Deployment", "tensor-fusion-scheduler", "extender")["volumeMounts"]
    assert {"name": "cloud-vendor-credentials", "mountPath": "/etc/cloud", "readOnly": True} in mounts

    for sets, message in (
        (("--set", "cloudVendorCredentials.accessKey=dummy",
          "--set", "cloudVendorCredentials.secretKey=dummy"),
         "\"dummy\" is TensorFusion's placeholder"),
        (("--set", "cloudVendorCredentials.accessKey=AKIA-ONLY"), "set both accessKey and secretKey"),
        (("--set", "cloudVendorCredentials.mountPath=relative"), "at '/cloudVendorCredentials/mountPath'"),
        (("--set", "cloudVendorCredentials.mountPath=/etc/cloud"),
         "cloudVendorCredentials.mountPath /etc/cloud is outside capacity.cloudKeyDir /tmp"),
    ):
        failed = _run(helm, "template", RELEASE, CHART, *sets, check=False)
        assert failed.returncode != 0 and message in failed.stderr, failed.stderr


def test_placement_defaults(helm):
    objs = render(
        helm,
        "--set",
        "cluster.enabled=false",
        "--set",
        "placement.defaultPool.create=true",
        "--set",
        "placement.defaultPool.name=gpus",
        "--set",
        "placement.defaultPool.mode=CompactFirst",
    )
    pool = _find(objs, "GPUPool", "gpus")
    assert pool["metadata"]["annotations"] == {"tensor-fusion.ai/is-default-pool": "true"}
    assert pool["spec"]["schedulingConfigTemplate"] == "gpus-placement"
    assert _find(objs, "SchedulingConfigTemplate", "gpus-placement")["spec"] == {
        "placement": {"mode": "CompactFirst"}
    }
    bad = _run(
        helm,
        "template",
        RELEASE,
        CHART,
        "--set",
        "cluster.enabled=false",
        "--set",
        "placement.defaultPool.create=true",
        "--set",
        "placement.defaultPool.mode=Fastest",
        check=False,
    )
    assert bad.returncode != 0 and "placement.defaultPool.mode" in bad.stderr


def test_cluster_autoscaler_hints(helm):
    objs = render(helm, "--set", "clusterAutoscaler.nodeTemplateHints=true")
    hints = cpl.MANIFESTS / "optional" / "cluster-autoscaler" / "node-template-hints.yaml"
    cm = _find(objs, "ConfigMap", "tensor-fusion-cluster-autoscaler-hints")
    assert cm["data"]["node-template-hints.yaml"] == hints.read_text()
    assert not [o for o in render(helm) if o["metadata"]["name"] == "tensor-fusion-cluster-autoscaler-hints"]
    bad = _run(helm, "template", RELEASE, CHART, "--set", "clusterAutoscaler.provider=openstack", check=False)
    assert bad.returncode != 0
    assert "at '/clusterAutoscaler/provider': value must be one of" in bad.stderr  # the schema


# ------------------------------------------------------------------------- install, schedule, upgrade


@pytest.fixture(scope="module")
def helm_cluster(e2e_binaries, tmp_path_factory):
    """A control plane of this module's own, without the project's CRDs (the chart installs them)."""
    cp = cpl.ControlPlane(tmp_path_factory.mktemp("helm-cp"), e2e_binaries)
    started: list[cpl.ManagedProcess] = []
    try:
        cp.start()
        yield cp, started
    finally:
        for proc in reversed(started):
            proc.stop()
            cp.registry.forget(proc)
        cp.stop()


def _gone(read: Any) -> bool:
    try:
        read()
    except client.ApiException as exc:
        return exc.status == 404
    return False


def _prepare_crds(cp: cpl.ControlPlane, e2e_binaries: dict[str, Path]) -> None:
    """Karpenter's NodeOverlay CRD, as on a cluster that runs Karpenter, so the chart's lookup finds it."""
    cpl.apply_crds(cp.api_client(), [Path(e2e_binaries["karpenter-crds"]) / "karpenter.sh_nodeoverlays.yaml"])


def test_install_schedule_upgrade_uninstall(helm, helm_cluster, e2e_binaries):
    cp, started = helm_cluster
    kc = cp.kubeconfig
    api = cp.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    custom = client.CustomObjectsApi(api)
    _prepare_crds(cp, e2e_binaries)

    out = _run(
        helm,
        "install",
        RELEASE,
        CHART,
        "--namespace",
        NS,
        "--create-namespace",
        "--no-hooks",
        "--set",
        "clusterAutoscaler.provider=aws",
        *VENDOR_KEYS,
        kubeconfig=kc,
    )
    assert "STATUS: deployed" in out.stdout
    # the notes tell what to put on GPU node groups that scale from zero
    assert "k8s.io/cluster-autoscaler/node-template/resources/tensor-fusion.ai/index_f" in out.stdout
    # and which default objects it made
    assert "kubectl get tensorfusioncluster tensor-fusion   (default pool tensor-fusion-shared)" in out.stdout
    installed = [
        d
        for d in yaml.safe_load_all(
            _run(helm, "get", "manifest", RELEASE, "--namespace", NS, kubeconfig=kc).stdout
        )
        if d
    ]
    expected = render(helm, "--set", "karpenter.nodeOverlay=true", *VENDOR_KEYS)  # what the lookup chose
    assert {_key(o) for o in installed} == {_key(o) for o in expected if not _is_hook(o)}
    defaults = [
        ("schedulingconfigtemplates", cpl.TF_GROUP, cpl.TF_VERSION, "tf-scheduling-config"),
        ("tensorfusionclusters", cpl.TF_GROUP, cpl.TF_VERSION, "tensor-fusion"),
        ("nodeoverlays", "karpenter.sh", "v1alpha1", "tensor-fusion-overlay"),
    ]
    for plural, group, version, name in defaults:  # stored as rendered, kept on uninstall
        obj = custom.get_cluster_custom_object(group, version, plural, name)
        assert obj["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    overlay = custom.get_cluster_custom_object(
        "karpenter.sh", "v1alpha1", "nodeoverlays", "tensor-fusion-overlay"
    )
    assert overlay["spec"]["requirements"] == [] and len(overlay["spec"]["capacity"]) == 16
    cpl.wait_until(
        lambda: (
            client.ApiextensionsV1Api(api)
            .read_custom_resource_definition("gpus.tensor-fusion.ai")
            .status.accepted_names.kind
            == "GPU"
        ),
        30,
        what="the chart's CRDs",
    )

    # pre-install then post-install hook, as Helm runs them
    hooks = _hook_objects(helm, kc)
    first = _run_hook(cp, hooks)
    assert "generated a new CA" in first and "does not exist yet" not in first  # the config is installed
    again = _run_hook(cp, hooks)
    assert "reused the CA" in again and "kept Secret" in again and "already carries the CA" in again
    tls = core.read_namespaced_secret("tensor-fusion-webhook-tls", NS)
    ca_pem = base64.b64decode(tls.data["ca.crt"])
    config = admission.read_mutating_webhook_configuration("tensor-fusion-webhook")
    assert base64.b64decode(config.webhooks[0].client_config.ca_bundle) == ca_pem

    # the installed processes, run locally, and a GPU pod placed through them
    helm_chart.start_release(cp, started, installed, e2e_binaries)
    helm_chart.schedule_a_gpu_pod(cp)

    # upgrade: new values reach the objects; the caBundle the hook set survives Helm's three-way merge
    helm_chart.webhook_back_to_service(cp, ca_pem)
    out = _run(
        helm,
        "upgrade",
        RELEASE,
        CHART,
        "--namespace",
        NS,
        "--no-hooks",
        "--set",
        "extender.maxPodsPerNode=128",
        "--set",
        "webhook.replicas=3",
        "--set",
        "cloudVendorCredentials.accessKey=AKIA-UPGRADE",
        "--set",
        "cloudVendorCredentials.secretKey=secret-upgrade",
        kubeconfig=kc,
    )
    assert "STATUS: deployed" in out.stdout and "REVISION: 2" in out.stdout
    assert apps.read_namespaced_deployment("tensor-fusion-webhook", NS).spec.replicas == 3
    sched = apps.read_namespaced_deployment("tensor-fusion-scheduler", NS).spec.template.spec
    assert "--max-pods-per-node=128" in next(c for c in sched.containers if c.name == "extender").command
    config = admission.read_mutating_webhook_configuration("tensor-fusion-webhook")
    assert base64.b64decode(config.webhooks[0].client_config.ca_bundle) == ca_pem
    # the cloud keys: written at install; an existing Secret is never overwritten (edit it to rotate), and
    # leaving it out of the upgrade's manifest does not delete it (resource-policy keep)
    assert _secret_keys(core) == {"ak": "AKIA-INSTALL", "sk": "secret-install"}
    core.patch_namespaced_secret(VENDOR_SECRET, NS, {"stringData": {"ak": "AKIA-BY-HAND"}})
    out = _run(helm, "upgrade", RELEASE, CHART, "--namespace", NS, "--no-hooks", "--reuse-values",
               kubeconfig=kc)
    assert "REVISION: 3" in out.stdout
    assert _secret_keys(core) == {"ak": "AKIA-BY-HAND", "sk": "secret-install"}
    upgraded = _run_hook(cp, _hook_objects(helm, kc))  # the pre-upgrade hook keeps what is valid
    assert "reused the CA" in upgraded and "kept Secret" in upgraded

    out = _run(helm, "uninstall", RELEASE, "--namespace", NS, kubeconfig=kc)
    assert "uninstalled" in out.stdout
    for what, read in (
        ("the scheduler Deployment", lambda: apps.read_namespaced_deployment("tensor-fusion-scheduler", NS)),
        (
            "the webhook configuration",
            lambda: admission.read_mutating_webhook_configuration("tensor-fusion-webhook"),
        ),
        (
            "the extender's ClusterRole",
            lambda: client.RbacAuthorizationV1Api(api).read_cluster_role("tensor-fusion-extender"),
        ),
    ):
        cpl.wait_until(lambda read=read: _gone(read), 30, what=f"uninstall to remove {what}")
    # Helm keeps CRDs (and so the GPU objects) on uninstall, by design; the hook's Secrets stay too; and the
    # default objects stay, as TensorFusion's do (helm.sh/resource-policy: keep)
    for plural, group, version, name in defaults:
        assert custom.get_cluster_custom_object(group, version, plural, name)["metadata"]["name"] == name
    assert client.ApiextensionsV1Api(api).read_custom_resource_definition("gpus.tensor-fusion.ai")
    assert _run(helm, "list", "--namespace", NS, "-q", kubeconfig=kc).stdout.strip() == ""
    assert _secret_keys(core) == {"ak": "AKIA-BY-HAND", "sk": "secret-install"}, "kept on uninstall"
    # Another release (or TensorFusion's chart) on a cluster that has these objects leaves them to their
    # owner instead of failing on a name clash: here they carry release tfe's annotations.
    other = _run(helm, "install", "other", CHART, "--namespace", NS, "--dry-run=server", "--no-hooks",
                 *VENDOR_KEYS, kubeconfig=kc)
    rendered = [d for d in yaml.safe_load_all(other.stdout.split("NOTES:")[0].split("MANIFEST:")[-1]) if d]
    kinds = {o["kind"] for o in rendered}
    assert "Deployment" in kinds, kinds
    assert not kinds & {"TensorFusionCluster", "SchedulingConfigTemplate", "NodeOverlay"}, kinds
    assert not [o for o in rendered if o["kind"] == "Secret" and o["metadata"]["name"] == VENDOR_SECRET]
    with contextlib.suppress(Exception):
        api.close()


def _secret_keys(core: Any) -> dict[str, str]:
    secret = core.read_namespaced_secret(VENDOR_SECRET, NS)
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def test_another_namespace_reaches_every_namespaced_reference(helm):
    out = _run(helm, "template", RELEASE, CHART, "--namespace", "gpu-system").stdout
    objects = json.dumps([d for d in yaml.safe_load_all(out) if d])  # without the comments
    assert "tensor-fusion-sys" not in objects
    assert "system:serviceaccount:gpu-system:tensor-fusion-scheduler" in objects  # the admission policies


# -------------------------------------------------------------------- every option, the schema, the tag

# tf-extender serve flags the chart fixes rather than exposes: its pod's topology (loopback verbs, the metrics
# port the probes use), in-cluster credentials, plain HTTP on loopback, the catalog as a file (the chart takes
# capacity.catalogConfigMap instead), and --config itself (values are the chart's config file).
FIXED_BY_THE_CHART = {"--port", "--bind-address", "--metrics-port", "--metrics-bind-address", "--prefix",
                      "--kubeconfig", "--cert-dir", "--catalog", "--autoscale-usage-file", "--config",
                      # TensorFusionCluster and GPUNode controllers: off when TensorFusion's own API is served
                      "--tensorfusion-clusters", "--gpu-nodes",
                      "--computing-vendor"}  # a file; in-cluster: the TensorFusionCluster
EVERY_EXTENDER_VALUE = {
    "extender.inventorySource": "gpu-objects", "extender.maxPodsPerNode": "32",
    "extender.bindDeadline": "40s",
    "extender.filterFirstChoice": "false", "extender.preemptor": "false", "extender.nudgeScheduler": "false",
    "extender.writeGpuStatus": "true", "extender.gpuStatusInterval": "3s", "extender.logLevel": "debug",
    "defrag.enabled": "false", "defrag.replacementTimeout": "2m", "expansion.enabled": "false",
    "expansion.delay": "20s", "expansion.maxInflightNodes": "4", "expansion.claimTimeout": "10m",
    "expansion.leaseNamespace": "leases", "scheduler.name": "gpu-scheduler",
    "clusterAutoscaler.nodeProvisioner": "cluster-autoscaler", "clusterAutoscaler.gpuReservations": "false",
    "clusterAutoscaler.placeholderNamespace": "holders", "clusterAutoscaler.placeholderImage": "pause:9",
    "clusterAutoscaler.placeholderSchedulerName": "other", "capacity.enabled": "false",
    "capacity.interval": "30s", "capacity.nodeProtectionTime": "1h",
    "capacity.catalogConfigMap": "ns/catalog",
    "autoscale.enabled": "true", "autoscale.interval": "1m", "autoscale.cronTimeZone": "Europe/Paris",
    "capacity.clusterName": "prod", "capacity.nodeJoinTimeout": "20m", "capacity.orphanGrace": "1h",
    "capacity.capacityErrorBackoff": "2m", "capacity.cloudKeyDir": "/tmp/secret",
    "capacity.cloudEndpointAllow": "vpce.example.com",
    "autoscale.prometheusUrl": "http://prometheus:9090", "autoscale.usageMetrics": "hypervisor",
    "autoscale.tflopsQuery": "tflops_q", "autoscale.vramQuery": "vram_q", "autoscale.prometheusStep": "1m",
    "autoscale.prometheusMaxPoints": "200",
    "extender.tensorFusionClusterInterval": "1m", "extender.gpuNodeInterval": "10s",
    "extender.gpuQuotas": "false", "extender.gpuQuotaStatusInterval": "20s",
    "extender.gangScheduling": "false", "extender.gangReserveTimeout": "2m",
    "extender.instanceTopologyConfigMap": "ns/topology",
}


def test_every_serve_option_is_a_value_and_reaches_the_command_line(helm):
    from extender import cli as extender_cli
    from extender.common.options import configurable
    from webhook import cli as webhook_cli

    sets = [a for key, value in EVERY_EXTENDER_VALUE.items() for a in ("--set", f"{key}={value}")]
    sets += ["--set", "webhook.certReloadInterval=5s", "--set", "webhook.karpenterDoNotDisrupt=false",
             "--set", "webhook.logLevel=warning", "--set", "webhook.requestTimeout=3s",
             "--set", "webhook.qosPriority.namespaces={ml}", "--set", "webhook.qosPriority.pools={gold}"]
    objs = render(helm, *sets)
    command = _container(objs, "Deployment", "tensor-fusion-scheduler", "extender")["command"]
    parser = extender_cli.build_parser()
    serve = {a.option_strings[0] for a in configurable(extender_cli.serve_parser(parser))}
    given = {arg.split("=")[0].replace("--no-", "--") for arg in command[2:]}
    assert sorted(serve - FIXED_BY_THE_CHART - given) == [], "serve flags no chart value reaches"
    args = _parse(parser, command)
    assert (args.inventory_source, args.max_pods_per_node, args.bind_deadline, args.filter_first_choice,
            args.preemptor, args.nudge_scheduler, args.write_gpu_status, args.gpu_status_interval,
            args.log_level) == ("gpu-objects", 32, 40.0, False, False, False, True, 3.0, "debug")
    assert (args.defrag, args.defrag_replacement_timeout) == (False, 120.0)
    assert (args.expansion_enabled, args.expansion_delay, args.max_inflight_nodes,
            args.expansion_claim_timeout, args.expansion_lease_namespace, args.expansion_scheduler_name) == (
        False, 20.0, 4, 600.0, "leases", "gpu-scheduler")
    assert (args.node_provisioner, args.gpu_reservations, args.placeholder_namespace, args.placeholder_image,
            args.placeholder_scheduler_name) == ("cluster-autoscaler", False, "holders", "pause:9", "other")
    assert (args.capacity_enabled, args.capacity_interval, args.node_protection_time,
            args.catalog_configmap) == (False, 30.0, 3600.0, "ns/catalog")
    assert (args.autoscale, args.autoscale_interval, args.autoscale_cron_time_zone) == (
        True, 60.0, "Europe/Paris")
    assert (args.autoscale_prometheus_url, args.autoscale_usage_metrics, args.autoscale_tflops_query,
            args.autoscale_vram_query, args.autoscale_prometheus_max_points) == (
        "http://prometheus:9090", "hypervisor", "tflops_q", "vram_q", 200)
    assert (args.tensorfusion_cluster_interval, args.gpu_node_interval) == (60.0, 10.0)
    assert (args.cluster_name, args.node_join_timeout, args.orphan_grace, args.capacity_error_backoff) == (
        "prod", 1200.0, 3600.0, 120.0)
    web = _parse(webhook_cli.build_parser(),
                 _container(objs, "Deployment", "tensor-fusion-webhook", "webhook")["command"])
    assert (web.cert_reload_interval, web.karpenter_do_not_disrupt, web.log_level, web.request_timeout,
            web.scheduler_name) == (5.0, "false", "warning", 3.0, "gpu-scheduler")
    assert (web.qos_priority_namespaces, web.qos_priority_pools) == (f"{NS},ml", "gold")
    webhook_parser = webhook_cli.serve_parser(webhook_cli.build_parser())
    webhook_serve = {a.option_strings[0] for a in configurable(webhook_parser)}
    fixed_webhook = {"--port", "--bind-address", "--metrics-port", "--cert-dir", "--kubeconfig", "--config"}
    given = {arg.split("=")[0] for arg in _container(objs, "Deployment", "tensor-fusion-webhook", "webhook")[
        "command"][2:]}
    assert sorted(webhook_serve - fixed_webhook - given) == []


@pytest.mark.parametrize(("value", "message"), [
    ("extender.maxPodPerNode=3", "at '/extender': additional properties 'maxPodPerNode' not allowed"),
    ("expanson.enabled=false", "additional properties 'expanson' not allowed"),
    ("expansion.delay=soon", "at '/expansion/delay'"),
    ("extender.inventorySource=magic", "at '/extender/inventorySource'"),
    ("extender.maxPodsPerNode=0", "at '/extender/maxPodsPerNode'"),
    ("capacity.catalogConfigMap=no-slash", "at '/capacity/catalogConfigMap'"),
])
def test_the_schema_rejects_a_misspelt_key_or_a_bad_value(helm, value, message):
    lint = _run(helm, "lint", "--strict", CHART, "--set", value, check=False)
    assert lint.returncode != 0 and message in lint.stdout + lint.stderr
    install = _run(helm, "template", RELEASE, CHART, "--set", value, check=False)
    assert install.returncode != 0 and message in install.stderr


def test_kube_scheduler_follows_the_cluster_version_unless_told(helm):
    def image(*args: str) -> str:
        return str(_container(render(helm, *args), "Deployment", "tensor-fusion-scheduler", "kube-scheduler")[
            "image"])

    assert image() == f"registry.k8s.io/kube-scheduler:{KUBE_VERSION}"
    assert image("--kube-version", "v1.31.2") == "registry.k8s.io/kube-scheduler:v1.31.2"
    assert image("--kube-version", "v1.33.4-eks-a737599") == "registry.k8s.io/kube-scheduler:v1.33.4"
    assert image("--set", "scheduler.image.tag=v1.32.0", "--set", "scheduler.image.repository=mirror/ks") == (
        "mirror/ks:v1.32.0")
    old = _run(helm, "template", RELEASE, CHART, "--kube-version", "v1.29.9", check=False)
    assert old.returncode != 0 and "kubeVersion" in old.stderr


def test_a_values_file_gives_whole_numbers_and_durations_as_written(helm, tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text("extender:\n  maxPodsPerNode: 1000000\n  bindDeadline: 1m30s\n"
                      "expansion:\n  delay: 30\n")  # bare seconds: still read, with a deprecation line
    command = _container(render(helm, "-f", str(values)), "Deployment", "tensor-fusion-scheduler",
                         "extender")["command"]
    assert {"--max-pods-per-node=1000000", "--bind-deadline=1m30s", "--expansion-delay=30"} <= set(command)
    from extender import cli as extender_cli

    args = _parse(extender_cli.build_parser(), command)
    assert (args.max_pods_per_node, args.bind_deadline, args.expansion_delay) == (1000000, 90.0, 30.0)


# --- least privilege: each feature's rights only with the feature ----------------------------------------

SCHEDULER_SA = "tensor-fusion-scheduler"


def granted(objs: list[dict[str, Any]], account: str = SCHEDULER_SA) -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, verb, where) the chart's own roles give ``account``: where is ``cluster``, or the
    namespace of a RoleBinding, with ``[names]`` appended when the rule names its objects."""
    by_name = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objs
               if o["kind"] in ("ClusterRole", "Role")}
    out: set[tuple[str, str, str, str]] = set()
    for binding in (o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   for s in binding.get("subjects") or []):
            continue
        namespace = binding["metadata"].get("namespace", "")
        ref = binding["roleRef"]
        role = by_name.get((ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"]))
        if role is None:
            continue  # a built-in role (system:kube-scheduler ...): not the chart's to narrow
        where = "cluster" if binding["kind"] == "ClusterRoleBinding" else namespace
        for rule in role.get("rules") or []:
            names = f"[{','.join(rule['resourceNames'])}]" if rule.get("resourceNames") else ""
            for group in rule.get("apiGroups") or [""]:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        out.add((group, resource, verb, where + names))
    return out


NODE_PATCH = ("", "nodes", "patch", "cluster")
NODE_DELETE = ("", "nodes", "delete", "cluster")
POOL_WRITES = {("tensor-fusion.ai", "gpupools", verb, "cluster") for verb in ("create", "patch", "delete")}
CLUSTER_STATUS = ("tensor-fusion.ai", "tensorfusionclusters/status", "patch", "cluster")


@pytest.mark.parametrize(("args", "present", "absent"), [
    ((), {NODE_PATCH, NODE_DELETE, CLUSTER_STATUS, *POOL_WRITES}, set()),
    (("--set", "capacity.enabled=false"), {NODE_PATCH}, {NODE_DELETE}),  # the nudger still patches
    (("--set", "extender.nudgeScheduler=false"), {NODE_PATCH, NODE_DELETE}, set()),  # compaction does
    (("--set", "capacity.enabled=false", "--set", "extender.nudgeScheduler=false"), set(),
     {NODE_PATCH, NODE_DELETE}),
    (("--set", "extender.tensorFusionClusters=false"), set(), {CLUSTER_STATUS, *POOL_WRITES}),
    (("--api-versions", "tensor-fusion.ai/v1/TensorFusionConnection"), set(),
     {CLUSTER_STATUS, *POOL_WRITES}),
], ids=["defaults", "capacity-off", "nudger-off", "both-off", "tfclusters-off",
        "tensorfusion-own-controller"])
def test_each_feature_off_takes_its_verbs_away(helm, args, present, absent):
    objs = render(helm, *args)
    verbs = granted(objs)
    assert present <= verbs, sorted(present - verbs)
    assert not absent & verbs, sorted(absent & verbs)
    # whatever the features, a ConfigMap is read only by name
    assert not [v for v in verbs if v[1] == "configmaps" and "[" not in v[3]], sorted(verbs)
    if "--set" in args:  # the extender is told the same: a feature off in RBAC is off in its flags
        (deployment,) = [o for o in objs
                         if o["kind"] == "Deployment" and "scheduler" in o["metadata"]["name"]]
        (extender,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                       if c["name"] == "extender"]
        command = " ".join(extender["command"])
        if "capacity.enabled=false" in args:
            assert "--no-capacity-controllers" in command
        if "extender.tensorFusionClusters=false" in args:
            assert "--no-tensorfusion-clusters" in command


def test_the_catalog_configmap_is_read_by_name_in_its_namespace_only(helm):
    verbs = granted(render(helm, "--set", "capacity.catalogConfigMap=gpu-catalogs/catalog"))
    assert ("", "configmaps", "get", "gpu-catalogs[catalog]") in verbs
    assert [v for v in verbs if v[1] == "configmaps"] == [("", "configmaps", "get", "gpu-catalogs[catalog]")]
    assert not [v for v in granted(render(helm)) if v[1] == "configmaps"]


def test_the_instance_topology_configmap_is_watched_by_name_in_its_namespace_only(helm):
    verbs = granted(render(helm, "--set", "extender.instanceTopologyConfigMap=gpu-topo/table"))
    assert sorted(v for v in verbs if v[1] == "configmaps") == [
        ("", "configmaps", verb, "gpu-topo[table]") for verb in ("get", "list", "watch")]
