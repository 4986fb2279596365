"""``tf-extender crds``: which CRDs it would create, update or leave, and which it refuses and why."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from extender import crds_cmd
from extender.crds_cmd import Action, decide, foreign_owner, lacking_fields, read_crds, schema_fields
from tests.unit.fixtures import ROOT

CRDS = ROOT / "manifests" / "crds"


def _ours(plural: str = "gpus") -> dict[str, Any]:
    (crd,) = [d for d in yaml.safe_load_all((CRDS / f"tensor-fusion.ai_{plural}.yaml").read_text()) if d]
    return crd


def _stored(crd: dict[str, Any]) -> dict[str, Any]:
    """What the API server hands back for ``crd``: metadata it adds, status."""
    out = copy.deepcopy(crd)
    out["metadata"].update(resourceVersion="42", uid="u-1", creationTimestamp="2026-12-02T00:00:00Z")
    out["status"] = {"storedVersions": ["v1"], "conditions": [{"type": "Established", "status": "True"}]}
    return out


def test_read_crds_takes_every_crd_of_the_folder_and_skips_its_kustomization() -> None:
    crds = read_crds([CRDS])
    names = sorted(c["metadata"]["name"] for c in crds)
    files = sorted(p for p in CRDS.glob("*.yaml") if p.name != "kustomization.yaml")
    assert len(names) == len(files) and "gpus.tensor-fusion.ai" in names
    with pytest.raises(FileNotFoundError, match="nowhere"):
        read_crds([ROOT / "nowhere"])


def test_missing_unchanged_and_ours_with_a_new_field() -> None:
    ours = _ours()
    assert decide(ours, None).action is Action.CREATE
    assert decide(ours, _stored(ours)).action is Action.UNCHANGED
    labelled = _stored(ours)
    labelled["metadata"]["labels"]["team"] = "gpu"  # a label the cluster added is no change of ours
    assert decide(ours, labelled).action is Action.UNCHANGED
    older = _stored(ours)
    del older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert decide(ours, older).action is Action.UPDATE  # ours only adds


def test_tensor_fusions_crd_is_refused_by_its_marks() -> None:
    ours = _ours()
    theirs = _stored(ours)
    theirs["metadata"]["labels"] = {}
    theirs["metadata"]["annotations"] = {"controller-gen.kubebuilder.io/version": "v0.20.0"}
    verdict = decide(ours, theirs)
    assert verdict.action is Action.REFUSE
    assert "controller-gen v0.20.0" in verdict.reason and "TensorFusion" in verdict.reason
    assert "no label app.kubernetes.io/part-of=tensor-fusion-extender" in verdict.reason
    helm = _stored(ours)
    helm["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "Helm",
                                  "helm.sh/chart": "tensor-fusion-1.5.0"}
    helm["metadata"]["annotations"] = {"meta.helm.sh/release-name": "tensor-fusion",
                                       "meta.helm.sh/release-namespace": "tensor-fusion-sys"}
    reason = foreign_owner(helm) or ""
    assert "Helm release tensor-fusion-sys/tensor-fusion" in reason and "tensor-fusion-1.5.0" in reason
    # our label does not make a Helm release's CRD ours
    helm["metadata"]["labels"]["app.kubernetes.io/part-of"] = "tensor-fusion-extender"
    assert decide(ours, helm).action is Action.REFUSE


def test_a_crd_with_fields_ours_lacks_is_refused_and_they_are_named() -> None:
    ours = _ours()
    richer = _stored(ours)
    spec = richer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"].setdefault(
        "spec", {"type": "object", "properties": {}})
    spec.setdefault("properties", {})["extraField"] = {"type": "object", "properties": {"deeper": {}}}
    verdict = decide(ours, richer)
    assert verdict.action is Action.REFUSE
    assert ".spec.extraField" in verdict.reason and ".spec.extraField.deeper" in verdict.reason


def test_versions_and_stored_versions_ours_lacks_are_refused() -> None:
    ours = _ours()
    more = _stored(ours)
    v2 = copy.deepcopy(more["spec"]["versions"][0])
    v2.update(name="v2", storage=False)
    more["spec"]["versions"].append(v2)
    more["status"]["storedVersions"] = ["v1alpha1", "v1"]
    text = lacking_fields(ours, more)
    assert "stored versions v1alpha1" in text and "version v2" in text


def test_schema_walk_is_bounded() -> None:
    schema: dict[str, Any] = {}
    node = schema
    for _ in range(10_000):  # a hostile, absurdly deep schema: walked to the bound, never recursing
        child: dict[str, Any] = {}
        node["properties"] = {"a": child}
        node = child
    assert len(schema_fields(schema)) == 64
    wide = {"properties": {f"f{i}": {"items": {"additionalProperties": {"properties": {"x": {}}}}}
                           for i in range(3)}}
    assert schema_fields(wide) == {".f0", ".f1", ".f2", ".f0[]{}.x", ".f1[]{}.x", ".f2[]{}.x"}


def test_the_default_files_are_the_checkouts_else_the_installed_copy(tmp_path, monkeypatch):
    """In a checkout: manifests/crds; elsewhere (the image's working directory is /): the CRDs installed
    beside the program, so `tf-extender crds apply` in the image needs no -f."""
    shared = tmp_path / "prefix" / "share" / "tensor-fusion-extender" / "crds"
    monkeypatch.setattr(crds_cmd, "SHARED_FILES", shared)
    monkeypatch.chdir(tmp_path)
    assert crds_cmd.default_files() == "manifests/crds"  # nothing installed: the message names the usual
    shared.mkdir(parents=True)
    assert crds_cmd.default_files() == str(shared)
    (tmp_path / "manifests" / "crds").mkdir(parents=True)
    assert crds_cmd.default_files() == "manifests/crds"
