"""Installs that never destroy, on a real kube-apiserver of this module's own:

- ``tf-extender crds apply`` installs the project's CRDs (manifests/crds/, not part of the kustomize base);
- with a GPU and a GPUPool present, ``kubectl apply -k manifests/`` then ``kubectl delete -k manifests/``
  of the base leaves every CRD and every GPU object in place;
- ``apply`` updates an older CRD of ours and keeps the labels the cluster added;
- ``tf-extender crds check`` and ``apply`` refuse a CRD that TensorFusion's chart installed (controller-gen's
  annotation, Helm's marks, no label of ours) and one of ours whose stored schema has a field ours lacks,
  saying why, and write nothing.

Its own control plane (etcd and kube-apiserver only): deleting the base deletes the tensor-fusion-sys
namespace, the PriorityClasses and the webhook configuration, which the suite's session fixtures share.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from tests import harness as cpl

pytestmark = pytest.mark.e2e

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture(scope="module")
def own_cluster(e2e_binaries, tmp_path_factory):
    cp = cpl.ControlPlane(tmp_path_factory.mktemp("crds-cp"), e2e_binaries)
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


def _tf_extender(cp: cpl.ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cpl.console_script("tf-extender")), "crds", *args,
                           "--kubeconfig", str(cp.kubeconfig)],
                          capture_output=True, text=True, timeout=180 * cpl.TIMEOUT_SCALE)


def _crd(api: client.ApiClient, name: str) -> Any:
    return client.ApiextensionsV1Api(api).read_custom_resource_definition(name)


def _project_crd_names() -> list[str]:
    return sorted(cpl.load_yaml_docs(p)[0]["metadata"]["name"] for p in cpl.project_crd_files())


@pytest.fixture(scope="module")
def installed(own_cluster):
    """The project's CRDs, installed as docs/install.md says."""
    first = _tf_extender(own_cluster, "check", "-f", str(cpl.CRDS_DIR))
    assert first.returncode == 0, first.stdout + first.stderr
    assert sorted(line.split(":")[0] for line in first.stdout.splitlines()) == _project_crd_names()
    assert all(line.endswith(": create") for line in first.stdout.splitlines()), first.stdout
    applied = _tf_extender(own_cluster, "apply", "-f", str(cpl.CRDS_DIR))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    again = _tf_extender(own_cluster, "apply", "-f", str(cpl.CRDS_DIR))
    assert again.returncode == 0 and all(
        line.endswith(": unchanged") for line in again.stdout.splitlines()), again.stdout + again.stderr
    return own_cluster


def _kubectl(cp: cpl.ControlPlane, *args: str) -> subprocess.CompletedProcess[str] | None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    return subprocess.run([kubectl, "--kubeconfig", str(cp.kubeconfig), *args], capture_output=True,
                          text=True, timeout=180 * cpl.TIMEOUT_SCALE)


def _apply_base(cp: cpl.ControlPlane) -> None:
    done = _kubectl(cp, "apply", "-k", str(cpl.MANIFESTS))
    if done is not None:
        assert done.returncode == 0, done.stdout + done.stderr
        return
    # no kubectl on this machine: what `kubectl apply -k` sends, rendered as kustomize renders it
    dyn = DynamicClient(cp.api_client())
    for obj in cpl.render_kustomization(cpl.MANIFESTS):
        res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        res.server_side_apply(body=obj, name=obj["metadata"]["name"],
                              namespace=obj["metadata"].get("namespace"), field_manager="kubectl")


def _delete_base(cp: cpl.ControlPlane) -> list[str]:
    """``kubectl delete -k manifests/``; returns what it deleted (kind/name)."""
    done = _kubectl(cp, "delete", "-k", str(cpl.MANIFESTS), "--wait=false", "-o", "name")
    if done is not None:
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.split()
    dyn = DynamicClient(cp.api_client())
    deleted = []
    for obj in cpl.render_kustomization(cpl.MANIFESTS):
        res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        res.delete(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))
        deleted.append(f"{obj['kind'].lower()}/{obj['metadata']['name']}")
    return deleted


def test_deleting_the_base_leaves_every_crd_and_gpu_object(installed):
    cp = installed
    api = cp.api_client()
    custom = client.CustomObjectsApi(api)
    cpl.create_cluster_object(api, "gpupools", {"apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}",
                                                "kind": "GPUPool", "metadata": {"name": "keep-pool"},
                                                "spec": {}})
    cpl.create_gpu(api, "keep-gpu", "node-a", pool="keep-pool")
    _apply_base(cp)
    deleted = _delete_base(cp)
    assert any("deployment" in d for d in deleted)
    assert not any("customresourcedefinition" in d for d in deleted)
    for name in _project_crd_names():
        crd = _crd(api, name)
        assert crd.metadata.deletion_timestamp is None, name
    gpu = custom.get_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpus", "keep-gpu")
    pool = custom.get_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", "keep-pool")
    assert gpu["metadata"].get("deletionTimestamp") is None and gpu["status"]["capacity"]["tflops"] == "312"
    assert pool["metadata"].get("deletionTimestamp") is None


def _swap_crd(api: client.ApiClient, path: Path, change) -> dict:
    """Replace the cluster's CRD of ``path`` by a changed copy (created afresh: the change may remove the
    label a replace would keep), and return the copy as stored."""
    ext = client.ApiextensionsV1Api(api)
    (ours,) = cpl.load_yaml_docs(path)
    name = ours["metadata"]["name"]
    ext.delete_custom_resource_definition(name)
    cpl.wait_until(lambda: _gone(ext, name), 60 * cpl.TIMEOUT_SCALE, what=f"CRD {name} deleted")
    theirs = change(copy.deepcopy(ours))
    ext.create_custom_resource_definition(theirs)
    cpl.wait_until(lambda: _established(ext, name), 60 * cpl.TIMEOUT_SCALE, what=f"CRD {name} Established")
    return ext.read_custom_resource_definition(name).to_dict()


def _gone(ext: client.ApiextensionsV1Api, name: str) -> bool:
    try:
        ext.read_custom_resource_definition(name)
    except client.ApiException as exc:
        return exc.status == 404
    return False


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    crd = ext.read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])


def _as_tensor_fusion_installs_it(crd: dict) -> dict:
    """TensorFusion's chart ships controller-gen's CRDs; installed by Helm's crds/ they carry no label of
    ours (and, made by a release's templates, Helm's marks)."""
    crd["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "Helm"}
    crd["metadata"]["annotations"] = {"controller-gen.kubebuilder.io/version": "v0.20.0",
                                      "meta.helm.sh/release-name": "tensor-fusion",
                                      "meta.helm.sh/release-namespace": "tensor-fusion-sys"}
    return crd


def _with_a_field_ours_lacks(crd: dict) -> dict:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"].setdefault("spec", {"type": "object"})
    spec.setdefault("properties", {})["tensorFusionOnly"] = {"type": "string"}
    return crd


def test_check_and_apply_refuse_tensor_fusions_crd_and_one_with_more_fields(installed):
    cp = installed
    api = cp.api_client()
    ext = client.ApiextensionsV1Api(api)
    tf_owned = cpl.CRDS_DIR / "tensor-fusion.ai_workloadprofiles.yaml"
    richer = cpl.CRDS_DIR / "tensor-fusion.ai_schedulingconfigtemplates.yaml"
    _swap_crd(api, tf_owned, _as_tensor_fusion_installs_it)
    _swap_crd(api, richer, _with_a_field_ours_lacks)
    before = {n: _crd(api, n).metadata.resource_version for n in _project_crd_names()}

    check = _tf_extender(cp, "check", "-f", str(cpl.CRDS_DIR))
    assert check.returncode == 1, check.stdout + check.stderr
    lines = dict(line.split(": ", 1) for line in check.stdout.splitlines() if ": " in line)
    refused = lines["workloadprofiles.tensor-fusion.ai"]
    assert refused.startswith("refuse: the cluster's CRD is not ours"), refused
    for mark in ("Helm release tensor-fusion-sys/tensor-fusion", "controller-gen v0.20.0", "TensorFusion",
                 "no label app.kubernetes.io/part-of=tensor-fusion-extender"):
        assert mark in refused, (mark, refused)
    more = lines["schedulingconfigtemplates.tensor-fusion.ai"]
    assert more.startswith("refuse: ours would drop") and ".spec.tensorFusionOnly" in more, more
    assert lines["gpus.tensor-fusion.ai"] == "unchanged"

    apply = _tf_extender(cp, "apply", "-f", str(cpl.CRDS_DIR))
    assert apply.returncode == 1 and "refused: nothing written" in apply.stdout, apply.stdout + apply.stderr
    after = {n: _crd(api, n).metadata.resource_version for n in _project_crd_names()}
    assert after == before  # nothing written, the refused ones least of all
    kept = ext.read_custom_resource_definition("workloadprofiles.tensor-fusion.ai")
    assert kept.metadata.annotations["controller-gen.kubebuilder.io/version"] == "v0.20.0"


def test_apply_updates_an_older_crd_of_ours_and_keeps_the_clusters_labels(installed):
    cp = installed
    ext = client.ApiextensionsV1Api(cp.api_client())
    name = "gpunodeclaims.tensor-fusion.ai"
    older = ext.read_custom_resource_definition(name).to_dict()
    body = client.ApiClient().sanitize_for_serialization(ext.read_custom_resource_definition(name))
    body["metadata"]["labels"]["team"] = "gpu-platform"
    del body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]  # ours adds it back
    ext.replace_custom_resource_definition(name, body)
    one = str(cpl.CRDS_DIR / "tensor-fusion.ai_gpunodeclaims.yaml")  # -f takes files too
    check = _tf_extender(cp, "check", "-f", one)
    assert check.stdout.splitlines() == [f"{name}: update"], check.stdout + check.stderr
    applied = _tf_extender(cp, "apply", "-f", one)
    assert applied.returncode == 0 and f"{name}: updated, Established" in applied.stdout, applied.stdout
    now = ext.read_custom_resource_definition(name)
    assert now.metadata.labels["team"] == "gpu-platform"
    assert "status" in now.spec.versions[0].schema.open_apiv3_schema.properties
    assert now.metadata.resource_version != older["metadata"]["resource_version"]
