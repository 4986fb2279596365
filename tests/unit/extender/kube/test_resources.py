import pytest

from extender.kube import resources as r


def test_core_and_group_collection_paths() -> None:
    assert r.collection_path(r.PODS) == "/api/v1/pods"
    assert r.collection_path(r.PODS, "team-a") == "/api/v1/namespaces/team-a/pods"
    assert r.collection_path(r.GPUS) == "/apis/tensor-fusion.ai/v1/gpus"
    assert r.collection_path(r.GPUS, "ignored") == "/apis/tensor-fusion.ai/v1/gpus"
    assert r.collection_path(r.NODECLAIMS) == "/apis/karpenter.sh/v1/nodeclaims"
    assert (r.collection_path(r.WORKLOAD_PROFILES, "ns")
            == "/apis/tensor-fusion.ai/v1/namespaces/ns/workloadprofiles")


def test_object_paths_and_subresources() -> None:
    assert r.object_path(r.PODS, "p", "ns", "binding") == "/api/v1/namespaces/ns/pods/p/binding"
    assert r.object_path(r.NODES, "n1") == "/api/v1/nodes/n1"
    with pytest.raises(ValueError):
        r.object_path(r.PODS, "p")
    with pytest.raises(ValueError):
        r.object_path(r.NODES, "..")


def test_scopes_and_api_versions() -> None:
    cluster_scoped = (r.GPUS, r.GPU_POOLS, r.SCHEDULING_CONFIG_TEMPLATES, r.NODECLAIMS, r.NODES)
    assert not any(res.namespaced for res in cluster_scoped)
    assert r.PODS.api_version == "v1"
    assert r.DEPLOYMENTS.api_version == "apps/v1"
    assert r.GPU_NODE_CLAIMS.api_version == "tensor-fusion.ai/v1"
