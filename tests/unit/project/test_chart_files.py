"""The Helm chart ships copies of manifests/ files (Helm cannot read outside the chart): they must stay
byte-identical. tests/e2e/test_helm_chart.py then checks that the rendered objects match as a whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.fixtures import ROOT

CHART = ROOT / "charts" / "tensor-fusion-extender"
COPIES = [
    (CHART / "files" / "rbac.yaml", ROOT / "manifests" / "rbac.yaml"),
    (CHART / "files" / "rbac-node-patch.yaml", ROOT / "manifests" / "rbac-node-patch.yaml"),
    (CHART / "files" / "rbac-node-delete.yaml", ROOT / "manifests" / "rbac-node-delete.yaml"),
    (CHART / "files" / "rbac-tensorfusionclusters.yaml",
     ROOT / "manifests" / "rbac-tensorfusionclusters.yaml"),
    (CHART / "files" / "priorityclasses.yaml", ROOT / "manifests" / "priorityclasses.yaml"),
    (CHART / "files" / "admission-policy.yaml", ROOT / "manifests" / "admission-policy.yaml"),
    (
        CHART / "files" / "cluster-autoscaler-node-template-hints.yaml",
        ROOT / "manifests" / "optional" / "cluster-autoscaler" / "node-template-hints.yaml",
    ),
    (
        CHART / "files" / "kube-scheduler-config.yaml",
        ROOT / "manifests" / "scheduler" / "kube-scheduler-config.yaml",
    ),
    (CHART / "files" / "gke-resourcequota.yaml",
     ROOT / "manifests" / "optional" / "gke" / "resourcequota.yaml"),
    (
        CHART / "files" / "grafana-dashboard.json",
        ROOT / "manifests" / "optional" / "monitoring" / "grafana-dashboard.json",
    ),
]


@pytest.mark.parametrize(("copy", "source"), COPIES, ids=lambda p: p.name)
def test_chart_copy_is_the_manifest(copy: Path, source: Path):
    assert copy.read_text() == source.read_text(), f"cp {source.relative_to(ROOT)} {copy.relative_to(ROOT)}"


def test_chart_crds_are_the_manifests_crds():
    ours = {p.name: p.read_text() for p in (ROOT / "manifests" / "crds").glob("*.yaml")
            if p.name != "kustomization.yaml"}  # the folder's kustomization, not a CRD
    chart = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert sorted(chart) == sorted(ours), "cp manifests/crds/*.yaml charts/tensor-fusion-extender/crds/"
    differing = sorted(name for name in ours if chart[name] != ours[name])
    assert not differing, f"copy again: {differing}"
