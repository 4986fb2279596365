"""The Cluster Autoscaler node-template hints (manifests/optional/cluster-autoscaler/) name exactly the index
resources mutated pods request, for every provider, in the form that provider reads."""

from __future__ import annotations

import yaml

from extender.common.contract import index_resource_names
from tests.unit.fixtures import ROOT

HINTS = ROOT / "manifests" / "optional" / "cluster-autoscaler" / \
    "node-template-hints.yaml"


def hints() -> dict:
    return yaml.safe_load(HINTS.read_text())


def test_the_hints_name_the_sixteen_index_resources() -> None:
    data = hints()
    assert data["resources"] == index_resource_names() and len(data["resources"]) == 16
    assert set(data["providers"]) == {"aws", "azure", "gce", "clusterapi", "kwok"}


def test_each_provider_spells_every_name_with_the_same_capacity() -> None:
    data = hints()
    names, capacity = index_resource_names(), data["indexCapacity"]
    providers = data["providers"]
    aws = providers["aws"]["tags"]
    assert aws == {f"k8s.io/cluster-autoscaler/node-template/resources/{n}": capacity for n in names}
    entries = providers["gce"]["autoscalerEnvVars"]["extended_resources"].split(",")
    assert entries == [f"{n}={capacity}" for n in names]
    assert providers["clusterapi"]["infrastructureTemplateStatusCapacity"] == dict.fromkeys(names, capacity)
    assert providers["clusterapi"]["annotations"]["capacity.cluster-autoscaler.kubernetes.io/gpu-type"] == \
        "nvidia.com/gpu"
    assert providers["kwok"]["allocatable"] == dict.fromkeys(names, capacity)


def test_azure_is_marked_unusable_because_its_tags_cannot_spell_an_underscore() -> None:
    azure = hints()["providers"]["azure"]
    assert azure["usable"] is False
    prefix = "k8s.io_cluster-autoscaler_node-template_resources_"
    for tag in azure["tags"]:
        # what the provider makes of the tag: every '_' and '~2' of the name becomes '/'
        read_as = tag[len(prefix):].replace("_", "/").replace("~2", "/")
        assert read_as not in index_resource_names()
